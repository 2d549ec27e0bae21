package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/nookhq/nook/internal/backupstore"
)

// backupS3SecretEnv holds the bucket's secret key. It is read from the
// environment (or a file) only, never from a flag, so that it shows in no
// process list; it is never logged and no API answers it.
const backupS3SecretEnv = "NOOK_BACKUP_S3_SECRET_KEY"

// backupFlags are nook serve's flags of the backup bucket.
type backupFlags struct {
	endpoint, bucket, region, accessKey, secretFile string
}

func (b *backupFlags) register(f *pflag.FlagSet) {
	f.StringVar(&b.endpoint, "backup-s3-endpoint", "", "S3-compatible endpoint (http://host:port, https://host, or host[:port] for https) that every backup is also copied to; empty: backups stay local only")
	f.StringVar(&b.bucket, "backup-s3-bucket", "", "bucket of the backup copies (must exist; path-style addressing; object key = backup id)")
	f.StringVar(&b.region, "backup-s3-region", "us-east-1", "region of the backup bucket")
	f.StringVar(&b.accessKey, "backup-s3-access-key", "", "access key id of the backup bucket (the secret key comes from $"+backupS3SecretEnv+" or --backup-s3-secret-key-file)")
	f.StringVar(&b.secretFile, "backup-s3-secret-key-file", "", "file holding the secret key of the backup bucket (instead of $"+backupS3SecretEnv+")")
}

// open returns the backup bucket's store, nil when none is configured.
func (b *backupFlags) open(ctx context.Context, log *slog.Logger) (backupstore.Store, error) {
	if b.endpoint == "" && b.bucket == "" {
		return nil, nil
	}
	if b.endpoint == "" || b.bucket == "" {
		return nil, errors.New("--backup-s3-endpoint and --backup-s3-bucket go together")
	}
	secret := os.Getenv(backupS3SecretEnv)
	if b.secretFile != "" {
		data, err := os.ReadFile(b.secretFile)
		if err != nil {
			return nil, fmt.Errorf("--backup-s3-secret-key-file: %w", err)
		}
		secret = strings.TrimSpace(string(data))
	}
	s3, err := backupstore.NewS3(backupstore.S3Config{
		Endpoint: b.endpoint, Bucket: b.bucket, Region: b.region, AccessKey: b.accessKey, SecretKey: secret,
	})
	if err != nil {
		return nil, err
	}
	// An unreachable bucket does not keep nook from serving: backups then
	// fail (503) with the reason until it is back.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s3.Check(cctx); err != nil {
		log.Warn("backup bucket not usable now; backups will fail until it is", "err", err)
	} else {
		log.Info("backups are copied to the backup bucket", "bucket", s3.String())
	}
	return s3, nil
}
