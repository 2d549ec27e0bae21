// Package store keeps nook's records (templates, sandboxes) in one embedded
// bbolt database in the data dir, as JSON values in named buckets.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ErrNotFound is returned when a key has no record.
var ErrNotFound = errors.New("record not found")

// Store is an embedded key-value store of JSON records.
type Store struct {
	db *bolt.DB
}

// Open opens (or creates) the database at path. Only one process may hold it.
func Open(path string) (*Store, error) {
	// NoSync: most writes describe live sandboxes, which a host crash ends
	// anyway, and a crash of nook serve alone loses nothing (the page cache
	// holds the writes); skipping fsync takes milliseconds off every create.
	// Records that must outlive a host crash call Sync.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: true})
	if err != nil {
		return nil, fmt.Errorf("open store %s (is another nook serve running?): %w", path, err)
	}
	return &Store{db: db}, nil
}

// Sync flushes every write so far to disk.
func (s *Store) Sync() error { return s.db.Sync() }

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Put stores v as JSON under bucket/key.
func (s *Store) Put(bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), data)
	})
}

// Get decodes the record at bucket/key into v.
func (s *Store) Get(bucket, key string, v any) error {
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return ErrNotFound
		}
		data := b.Get([]byte(key))
		if data == nil {
			return ErrNotFound
		}
		return json.Unmarshal(data, v)
	})
}

// Delete removes bucket/key; a missing key is not an error.
func (s *Store) Delete(bucket, key string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return nil
		}
		return b.Delete([]byte(key))
	})
}

// Each calls fn with every key and raw JSON value of bucket, in key order.
func (s *Store) Each(bucket string, fn func(key string, data []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error { return fn(string(k), v) })
	})
}

// All decodes every record of bucket and returns them in key order.
func All[T any](s *Store, bucket string) ([]T, error) {
	var out []T
	err := s.Each(bucket, func(_ string, data []byte) error {
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	return out, err
}
