//! `lattice-util` — the few helpers every process of Lattice needs where it meets the world, written
//! once: the wall clock in milliseconds since the Unix epoch ([`clock`]), URL pieces percent-encoded
//! ([`url`], on the `percent-encoding` crate) and file-system path segments that cannot climb out of
//! their directory ([`fs`]). The engine never uses it: its time is passed in.

pub mod clock;
pub mod fs;
pub mod url;
