#!/usr/bin/env sh
# Regenerates the committed gRPC stubs in longhaul/v1 from
# proto/proto/longhaul/v1/trainer.proto (needs `pip install grpcio-tools`).
# CI checks that the committed stubs match the proto
# (site-agent/tests/python.rs); run this after changing the proto.
set -eu
cd "$(dirname "$0")"
python3 -m grpc_tools.protoc -I ../../proto/proto --python_out=. --grpc_python_out=. --pyi_out=. longhaul/v1/trainer.proto
