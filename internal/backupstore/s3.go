package backupstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// DigestMeta is the user-metadata name under which an object's sha256 is
// kept (the header X-Amz-Meta-Sha256).
const DigestMeta = "Sha256"

// S3Config says where an S3-compatible bucket is. Addressing is always
// path-style (http://endpoint/bucket/key), which MinIO, Ceph, Garage,
// SeaweedFS and AWS all accept.
type S3Config struct {
	// Endpoint is a URL (http://host:port, https://host) or a bare
	// host[:port], which means https.
	Endpoint  string
	Bucket    string
	Region    string // default us-east-1
	AccessKey string
	SecretKey string
	// Transport is the HTTP transport (tests; nil: the default).
	Transport http.RoundTripper
	// MaxRetries bounds the tries of one request (0: minio-go's 10).
	MaxRetries int
}

// S3 is a store in an S3-compatible bucket; the object of key is
// bucket/key, with the digest given to Put in its metadata.
type S3 struct {
	c      *minio.Client
	bucket string
	where  string
}

// NewS3 returns a client of the bucket; it does not contact it (see Check).
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("backup S3: both an endpoint and a bucket are needed")
	}
	host, secure := cfg.Endpoint, true
	if strings.Contains(cfg.Endpoint, "://") {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("backup S3 endpoint %q: %v", cfg.Endpoint, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return nil, fmt.Errorf("backup S3 endpoint %q: want http:// or https://", cfg.Endpoint)
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return nil, fmt.Errorf("backup S3 endpoint %q: give only scheme, host and port (the bucket is a flag of its own)", cfg.Endpoint)
		}
		host, secure = u.Host, u.Scheme == "https"
	}
	if host == "" {
		return nil, fmt.Errorf("backup S3 endpoint %q: no host", cfg.Endpoint)
	}
	if (cfg.AccessKey == "") != (cfg.SecretKey == "") {
		return nil, errors.New("backup S3: give both an access key and a secret key, or neither (anonymous)")
	}
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	c, err := minio.New(host, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       secure,
		Region:       region,
		BucketLookup: minio.BucketLookupPath,
		Transport:    cfg.Transport,
		MaxRetries:   cfg.MaxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("backup S3: %v", err)
	}
	scheme := "https"
	if !secure {
		scheme = "http"
	}
	return &S3{c: c, bucket: cfg.Bucket, where: scheme + "://" + host + "/" + cfg.Bucket}, nil
}

func (s *S3) String() string { return s.where }

// Check tells whether the bucket can be reached and exists.
func (s *S3) Check(ctx context.Context) error {
	ok, err := s.c.BucketExists(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("backup bucket %s: %v", s.where, err)
	}
	if !ok {
		return fmt.Errorf("backup bucket %s does not exist", s.where)
	}
	return nil
}

func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64, digest string) error {
	if err := validKey(key); err != nil {
		return err
	}
	opts := minio.PutObjectOptions{ContentType: "application/gzip"}
	if digest != "" {
		opts.UserMetadata = map[string]string{DigestMeta: digest}
	}
	if _, err := s.c.PutObject(ctx, s.bucket, key, r, size, opts); err != nil {
		return fmt.Errorf("upload %s/%s: %v", s.where, key, err)
	}
	return nil
}

// Get opens the object; its reader fails if the object changes while it
// is read.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := validKey(key); err != nil {
		return nil, err
	}
	obj, err := s.c.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err == nil {
		_, err = obj.Stat()
	}
	if err != nil {
		if obj != nil {
			obj.Close()
		}
		if isNotFound(err) {
			return nil, fmt.Errorf("%s/%s: %w", s.where, key, ErrNotFound)
		}
		return nil, fmt.Errorf("download %s/%s: %v", s.where, key, err)
	}
	return obj, nil
}

// Digest is the sha256 kept in the object's metadata ("" when none).
func (s *S3) Digest(ctx context.Context, key string) (string, error) {
	if err := validKey(key); err != nil {
		return "", err
	}
	info, err := s.c.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return "", fmt.Errorf("%s/%s: %w", s.where, key, ErrNotFound)
		}
		return "", fmt.Errorf("stat %s/%s: %v", s.where, key, err)
	}
	return info.UserMetadata[DigestMeta], nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	if err := validKey(key); err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s/%s: %v", s.where, key, err)
	}
	return nil
}

func isNotFound(err error) bool {
	r := minio.ToErrorResponse(err)
	return r.Code == minio.NoSuchKey || r.StatusCode == http.StatusNotFound && r.Code != minio.NoSuchBucket
}
