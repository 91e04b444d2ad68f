//! Generates the public gRPC API (`proto/lattice/v1/*.proto`) with a vendored `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = tonic_prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            cfg,
            &[
                "proto/lattice/v1/allocations.proto",
                "proto/lattice/v1/nodes.proto",
                "proto/lattice/v1/admin.proto",
                "proto/lattice/v1/mirror.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
