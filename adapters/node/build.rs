//! Generates the agents' own gRPC service and the checkpoint callback's code with a vendored `protoc`
//! (no system install needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = tonic_prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(cfg, &["proto/checkpoint.proto", "proto/agent.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
