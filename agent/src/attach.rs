//! A terminal inside a running allocation (book: "Attach to Running Allocation", "Interactive
//! Sessions"): a PTY on this node with a shell (or the given command) as its session leader, in the
//! allocation's environment — and its mount namespace for a uenv allocation (`nsenter`). The user's
//! bytes go to the PTY (so Ctrl-C is the terminal's own SIGINT to its foreground group), resizes set
//! its window size, explicit signals go to its foreground process group, and a hang-up (the user went
//! away) is SIGHUP to the session. Output streams back until the shell's last process closes the
//! terminal, then its exit status.

use lattice_node_adapters::peer::{AttachInput, AttachOutput, AttachSession};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};

/// What the agent knows of an allocation running here, for its tasks and terminals.
#[derive(Clone, Debug, Default)]
pub struct AllocInfo {
    /// The environment its entrypoint got (the ranks get it too).
    pub env: Vec<(String, String)>,
    /// Its wrapper's pid: a uenv allocation's tasks join its mount namespace.
    pub pid: u32,
    pub mounted: bool,
    /// The secret `lattice-mpi-launcher` presents (`LATTICE_LAUNCH_TOKEN`).
    pub token: Option<String>,
}

/// The signal a name means (`INT` or `SIGINT`).
pub fn signal_of(name: &str) -> Option<i32> {
    Some(match name.trim_start_matches("SIG") {
        "INT" => libc::SIGINT,
        "TSTP" => libc::SIGTSTP,
        "QUIT" => libc::SIGQUIT,
        "HUP" => libc::SIGHUP,
        "TERM" => libc::SIGTERM,
        "KILL" => libc::SIGKILL,
        "WINCH" => libc::SIGWINCH,
        _ => return None,
    })
}

fn set_size(fd: i32, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: if rows == 0 { 24 } else { rows },
        ws_col: if cols == 0 { 80 } else { cols },
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer.
    unsafe {
        libc::ioctl(fd, libc::TIOCSWINSZ, &ws);
    }
}

/// The shell a terminal runs when no command is given: the allocation's `SHELL`, else bash, else sh.
fn shell(info: &AllocInfo) -> String {
    info.env
        .iter()
        .find(|(k, _)| k == "SHELL")
        .map(|(_, v)| v.clone())
        .or_else(|| {
            std::path::Path::new("/bin/bash")
                .is_file()
                .then(|| "/bin/bash".to_string())
        })
        .unwrap_or_else(|| "/bin/sh".to_string())
}

/// What a terminal runs and how it looks.
#[derive(Clone, Debug, Default)]
pub struct Terminal<'a> {
    /// `sh -c COMMAND`; `None`: the allocation's shell, as a login shell.
    pub command: Option<&'a str>,
    pub rows: u16,
    pub cols: u16,
    pub term: Option<&'a str>,
}

/// Opens a terminal in allocation `alloc` (described by `info`); `started` gets the session
/// leader's pid (stopped with the allocation), `ended` the same pid once it was waited for.
pub fn open(
    alloc: &str,
    info: &AllocInfo,
    t: Terminal<'_>,
    started: impl FnOnce(u32),
    ended: impl FnOnce(u32) + Send + 'static,
) -> std::io::Result<AttachSession> {
    let Terminal {
        command,
        rows,
        cols,
        term,
    } = t;
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes the two descriptors it opens.
    if unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned here.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [master.as_raw_fd(), slave.as_raw_fd()] {
        // SAFETY: sets close-on-exec on a descriptor owned here.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    set_size(master.as_raw_fd(), rows, cols);
    let argv: Vec<String> = match command {
        Some(c) => vec!["/bin/sh".into(), "-c".into(), c.to_string()],
        None => vec![shell(info), "-l".into()],
    };
    let mut cmd = if info.mounted && info.pid > 0 {
        let mut c = Command::new("nsenter");
        c.args(["--target", &info.pid.to_string(), "--mount", "--"]).args(&argv);
        c
    } else {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    };
    let home = std::env::var("HOME").unwrap_or_else(|_| "/".into());
    let dir = info
        .env
        .iter()
        .find(|(k, _)| k == "LATTICE_SCRATCH")
        .map(|(_, v)| v.clone())
        .filter(|d| std::path::Path::new(d).is_dir())
        .unwrap_or(home);
    cmd.envs(info.env.iter().map(|(k, v)| (k, v)))
        .env("TERM", term.unwrap_or("xterm-256color"))
        .env("LATTICE_ALLOC_ID", alloc)
        .env("LATTICE_ATTACH", "1")
        .current_dir(dir)
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave.try_clone()?));
    // SAFETY: setsid and ioctl are async-signal-safe: the shell leads a new session whose
    // controlling terminal is the PTY (its stdin), and dies with the agent thread that waits for it.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            crate::runner::default_signals();
            Ok(())
        });
    }
    let (in_tx, in_rx) = std::sync::mpsc::channel::<AttachInput>();
    let (out_tx, out_rx) = std::sync::mpsc::channel::<AttachOutput>();
    let (spawned_tx, spawned_rx) = std::sync::mpsc::channel::<std::io::Result<u32>>();
    // The thread that starts the shell waits for it (the parent-death signal is tied to it).
    std::thread::spawn(move || {
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = spawned_tx.send(Err(e));
                return;
            }
        };
        drop(cmd);
        drop(slave);
        let pid = child.id();
        let _ = spawned_tx.send(Ok(pid));
        let master = std::fs::File::from(master);
        let Ok(writer) = master.try_clone() else { return };
        // The user's side: bytes, sizes, signals; a closed channel is a hang-up.
        std::thread::spawn(move || {
            let mut writer = writer;
            for i in in_rx {
                match i {
                    AttachInput::Stdin(b) => {
                        if writer.write_all(&b).is_err() {
                            break;
                        }
                    }
                    AttachInput::Resize { rows, cols } => {
                        set_size(writer.as_raw_fd(), rows, cols);
                    }
                    AttachInput::Signal(name) => {
                        if let Some(sig) = signal_of(&name) {
                            // SAFETY: tcgetpgrp reads the terminal's foreground group; kill signals it.
                            unsafe {
                                let pg = libc::tcgetpgrp(writer.as_raw_fd());
                                libc::kill(-(if pg > 0 { pg } else { pid as i32 }), sig);
                            }
                        }
                    }
                }
            }
            // SAFETY: killpg only sends a signal; the shell leads its session's first group.
            unsafe {
                libc::killpg(pid as i32, libc::SIGHUP);
            }
        });
        let mut reader = master;
        let mut buf = [0u8; 16384];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if out_tx.send(AttachOutput::Stdout(buf[..n].to_vec())).is_err() {
                        // Nobody reads any more: hang up.
                        // SAFETY: as above.
                        unsafe {
                            libc::killpg(pid as i32, libc::SIGHUP);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // EIO: every process let go of the terminal.
                Err(_) => break,
            }
        }
        let code = match child.wait() {
            Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
            Err(_) => -1,
        };
        ended(pid);
        let _ = out_tx.send(AttachOutput::Exit(code));
    });
    let pid = spawned_rx
        .recv()
        .map_err(|_| std::io::Error::other("the terminal's thread ended"))??;
    started(pid);
    Ok(AttachSession {
        input: in_tx,
        output: out_rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn read_until(s: &AttachSession, want: &str, within: Duration) -> String {
        let t0 = Instant::now();
        let mut seen = String::new();
        while t0.elapsed() < within {
            match s.output.recv_timeout(Duration::from_millis(50)) {
                Ok(AttachOutput::Stdout(b)) => {
                    seen.push_str(&String::from_utf8_lossy(&b));
                    if seen.contains(want) {
                        return seen;
                    }
                }
                Ok(other) => seen.push_str(&format!("<{other:?}>")),
                Err(_) => {}
            }
            if seen.contains(want) {
                return seen;
            }
        }
        panic!("{want:?} never came: {seen:?}");
    }

    #[test]
    fn a_terminal_runs_the_shell_with_its_size_ctrl_c_and_exit_status() {
        let info = AllocInfo {
            env: vec![("SHELL".into(), "/bin/sh".into()), ("FROM_ALLOC".into(), "yes".into())],
            ..AllocInfo::default()
        };
        let mut pid = 0;
        let t = Terminal {
            command: None,
            rows: 30,
            cols: 100,
            term: Some("dumb"),
        };
        let s = open("a-1", &info, t, |p| pid = p, |_| {}).unwrap();
        assert!(pid > 0);
        let send = |t: &str| s.input.send(AttachInput::Stdin(t.as_bytes().to_vec())).unwrap();
        send("echo \"[$FROM_ALLOC $LATTICE_ALLOC_ID $TERM] $(stty size)\"\n");
        read_until(&s, "[yes a-1 dumb] 30 100", Duration::from_secs(5));
        s.input.send(AttachInput::Resize { rows: 50, cols: 132 }).unwrap();
        send("stty size\n");
        read_until(&s, "50 132", Duration::from_secs(5));
        // Ctrl-C (the byte) interrupts the foreground job, and the shell goes on.
        send("echo go$((1+1)); sleep 30; echo slept\n");
        read_until(&s, "go2", Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(100));
        send("\x03");
        // (The terminal drops what was typed ahead of an interrupt, as any terminal does.)
        read_until(&s, "^C", Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(200));
        send("echo after-$((6*7))\n");
        let seen = read_until(&s, "after-42", Duration::from_secs(5));
        assert!(!seen.contains("slept"), "{seen}");
        // An explicit signal goes to the foreground group too.
        send("echo re$((1+1)); sleep 30; echo slept\n");
        read_until(&s, "re2", Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(100));
        s.input.send(AttachInput::Signal("INT".into())).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        send("echo again-$((6*7))\n");
        read_until(&s, "again-42", Duration::from_secs(5));
        send("exit 3\n");
        read_until(&s, "<Exit(3)>", Duration::from_secs(5));
    }

    #[test]
    fn a_command_runs_instead_of_a_shell_and_a_hang_up_ends_it() {
        let info = AllocInfo::default();
        let cmd = |c| Terminal {
            command: Some(c),
            ..Terminal::default()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let s = open(
            "a-1",
            &info,
            cmd("echo one; exit 7"),
            |_| {},
            move |p| tx.send(p).unwrap(),
        )
        .unwrap();
        read_until(&s, "<Exit(7)>", Duration::from_secs(5));
        assert!(rx.recv_timeout(Duration::from_secs(1)).is_ok(), "its end was told");
        let s = open("a-1", &info, cmd("sleep 30"), |_| {}, |_| {}).unwrap();
        let AttachSession { input, output } = s;
        drop(input);
        let t0 = Instant::now();
        let end = loop {
            match output.recv_timeout(Duration::from_secs(5)).unwrap() {
                AttachOutput::Exit(c) => break c,
                _ => continue,
            }
        };
        assert_eq!(end, 128 + libc::SIGHUP);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(signal_of("SIGTSTP"), Some(libc::SIGTSTP));
        assert_eq!(signal_of("BOGUS"), None);
    }
}
