//! The protobuf messages and services of `proto/lattice/v1/*.proto` (tonic/prost): the public gRPC
//! API ([`crate::grpc`]) and the members' queue mirror ([`crate::mirror`]).

tonic::include_proto!("lattice.v1");

/// The encoded `FileDescriptorSet` of every service and message above.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lattice_descriptor");
