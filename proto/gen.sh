#!/bin/sh
# Regenerates internal/envdpb from proto/envd. Needs protoc, and
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
set -eu
cd "$(dirname "$0")"
PATH="$PATH:$(go env GOPATH)/bin"
rm -rf ../internal/envdpb
mkdir -p ../internal/envdpb
protoc -I envd -I /usr/include \
  --go_out=../internal/envdpb --go_opt=paths=source_relative \
  --connect-go_out=../internal/envdpb --connect-go_opt=paths=source_relative \
  --connect-go_opt=package_suffix=connect \
  process/process.proto filesystem/filesystem.proto
