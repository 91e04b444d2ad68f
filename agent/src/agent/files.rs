//! The agent's files beside its state file: the processes it runs (the state file, so a restarted
//! agent takes them over) and the exits not yet taken by the control plane (the exits file).

use crate::protocol::Exit;
use crate::runner;

/// The processes recorded by a previous agent (none when the file is absent; an unreadable one is
/// an error naming it — taking over nothing would orphan live jobs silently).
pub fn read_state(path: &std::path::Path) -> anyhow::Result<Vec<runner::Record>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| anyhow::anyhow!("state file {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("state file {}: {e}", path.display())),
    }
}

/// Writes the records (to a temporary file, then renamed: never half-written).
pub fn write_state(path: &std::path::Path, records: &[runner::Record]) -> std::io::Result<()> {
    write_json(path, records)
}

/// The exits a previous agent had not got taken (none when the file is absent; an unreadable one is
/// an error naming it — reporting nothing would leave those allocations running forever).
pub fn read_exits(path: &std::path::Path) -> anyhow::Result<Vec<Exit>> {
    let exits: Vec<Exit> = match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| anyhow::anyhow!("exits file {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow::anyhow!("exits file {}: {e}", path.display())),
    };
    Ok(exits)
}

/// Writes `value` as JSON to `path` through a temporary file renamed over it: never half-written.
pub(super) fn write_json<T: serde::Serialize + ?Sized>(path: &std::path::Path, value: &T) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap_or_default())?;
    std::fs::rename(tmp, path)
}
