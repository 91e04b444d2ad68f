//! `lattice-reports` — will own the site-review reporting of `rm-replay`: metrics tables (polars), charts
//! (plotters), self-contained HTML reports and baseline comparison.
//!
//! Status: not built yet (its issue has not come). Nothing here is implemented; the crate exists so the
//! workspace has the product's shape and heavy dependencies have a single home when they arrive.
