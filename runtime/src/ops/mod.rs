//! The API's operations, independent of the transport: REST ([`crate::api`]) and gRPC
//! ([`crate::grpc`]) both call these, so validation, authorization and tenant scoping are one code.

mod admin;
mod allocations;
mod audit;
mod common;
mod dags;
mod nodes;
mod observe;
mod site;

pub use crate::error::{ApiError, forbidden};
pub use admin::*;
pub use allocations::*;
pub use audit::*;
pub use common::*;
pub use dags::*;
pub use nodes::*;
pub use observe::*;
pub use site::*;
