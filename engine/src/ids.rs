//! Dense integer identifiers. Names (tenant "physics", vCluster "hpc-batch") live in the engine's registries;
//! decisions only ever see these ids, so no string hashing or map iteration order can reach a decision.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$m:meta])* $name:ident, $inner:ty) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub $inner);

        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A node, dense from 0 in inventory order.
    NodeId,
    u32
);
id_type!(
    /// An allocation, dense from 0 in submission order.
    AllocId,
    u64
);
id_type!(
    /// A tenant (an organisation with a contract and quotas).
    TenantId,
    u32
);
id_type!(
    /// A project inside a tenant.
    ProjectId,
    u32
);
id_type!(
    /// A vCluster (a scheduling domain with its own policy).
    VClusterId,
    u32
);
id_type!(
    /// A dragonfly topology group.
    GroupId,
    u32
);
