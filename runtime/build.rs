//! Generates the public gRPC API (`proto/lattice/v1/*.proto`) with a vendored `protoc`, and
//! their descriptors (`lattice_descriptor.bin`: what the REST-to-gRPC coverage test reads).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = tonic_prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("lattice_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            cfg,
            &[
                "proto/lattice/v1/allocations.proto",
                "proto/lattice/v1/nodes.proto",
                "proto/lattice/v1/admin.proto",
                "proto/lattice/v1/mirror.proto",
                "proto/lattice/v1/operations.proto",
            ],
            &["proto"],
        )?;
    // Each file (a directory's own mtime changes only when a file is added or removed, not when one
    // is edited), and the directory for added ones.
    println!("cargo:rerun-if-changed=proto/lattice/v1");
    for f in std::fs::read_dir("proto/lattice/v1")? {
        println!("cargo:rerun-if-changed={}", f?.path().display());
    }
    Ok(())
}
