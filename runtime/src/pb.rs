//! The protobuf messages and services of `proto/lattice/v1/*.proto` (tonic/prost): the public gRPC
//! API ([`crate::grpc`]) and the members' queue mirror ([`crate::mirror`]).

tonic::include_proto!("lattice.v1");
