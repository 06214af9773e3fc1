"""Generated Open Inference Protocol v2 gRPC messages (see oip_v2.proto, generate.sh)."""
