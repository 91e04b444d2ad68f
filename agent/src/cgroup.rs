//! A sensitive allocation's own cgroup (v2), for audit mode: its processes enter it between fork
//! and exec (so every child they make is in it too), and the eBPF `openat` program records the opens
//! of tasks whose cgroup id is watched ([`crate::ebpf`]). The cgroup's id is its directory's inode
//! number. Only the unified (v2) hierarchy is used: `/sys/fs/cgroup` on current systems, or
//! `/sys/fs/cgroup/unified` on hybrid ones (found in `/proc/self/mounts`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// One cgroup under `<cgroup2 mount>/lattice/`, removed (when empty) on drop.
#[derive(Debug)]
pub struct Group {
    dir: PathBuf,
    id: u64,
    procs: CString,
}

/// Where the unified hierarchy is mounted.
fn cgroup2_mount() -> std::io::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no cgroup2 hierarchy is mounted"))
}

impl Group {
    /// Creates (or reuses) the cgroup `lattice/NAME` (`NAME` made safe for a directory name).
    pub fn create(name: &str) -> std::io::Result<Group> {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let dir = cgroup2_mount()?.join("lattice").join(safe);
        std::fs::create_dir_all(&dir)?;
        let id = std::fs::metadata(&dir)?.ino();
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        Ok(Group { dir, id, procs })
    }

    /// Its cgroup id (what `bpf_get_current_cgroup_id` returns for its tasks).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The process `cmd` starts enters the cgroup before it execs (and so do its children).
    pub fn enter_on_exec(&self, cmd: &mut std::process::Command) {
        let procs = self.procs.clone();
        // SAFETY: between fork and exec only open, write and close run (async-signal-safe), on a
        // path made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                libc::close(fd);
                if n < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Fails (and stays) while processes are still in it; harmless.
        let _ = std::fs::remove_dir(&self.dir);
    }
}
