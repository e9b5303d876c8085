//! The control daemon and its client, over a Unix socket `control` in the pipe directory
//! (`CUDA_MPS_PIPE_DIRECTORY`): a client sends one command line and reads the answer. The daemon
//! logs to `control.log` in the log directory (`CUDA_MPS_LOG_DIRECTORY`).

use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::defaults::{Defaults, Reply};

/// Where a daemon listens and logs.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`).
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY` (default `/var/log/nvidia-mps`).
    pub log: PathBuf,
}

impl Dirs {
    /// The daemon's control socket.
    pub fn control(&self) -> PathBuf {
        self.pipe.join("control")
    }
}

/// Serves control commands in the foreground until a client sends `quit`, then removes its
/// socket. Refuses to start where another daemon answers on the same pipe directory.
pub fn serve(dirs: &Dirs, mut defaults: Defaults, devices: Option<&str>) -> io::Result<()> {
    fs::create_dir_all(&dirs.pipe)?;
    fs::create_dir_all(&dirs.log)?;
    let control = dirs.control();
    if UnixStream::connect(&control).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "an MPS control daemon already serves {}",
                dirs.pipe.display()
            ),
        ));
    }
    match fs::remove_file(&control) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(&control)?;
    let log = |text: &str| append_log(&dirs.log, text);
    log(&format!(
        "Startup: devices {}, default active thread percentage {}, pinned memory limits {:?}",
        devices.unwrap_or("all"),
        defaults
            .active_thread_percentage
            .map_or_else(|| "none".to_owned(), |p| format!("{p:.1}")),
        defaults.pinned_mem_limits
    ))?;
    for conn in listener.incoming() {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                log(&format!("accept: {e}"))?;
                continue;
            }
        };
        let mut line = String::new();
        if BufReader::new(&conn).read_line(&mut line).is_err() {
            continue;
        }
        log(&format!("Command: {}", line.trim()))?;
        match defaults.answer(&line) {
            Reply::Text(text) => {
                let _ = writeln!(conn, "{text}");
            }
            Reply::Quit => break,
        }
    }
    fs::remove_file(&control)?;
    log("Shutdown")
}

/// Sends `command` to the daemon serving `pipe` and returns its answer.
pub fn ask(pipe: &Path, command: &str) -> io::Result<String> {
    let control = pipe.join("control");
    let mut conn = UnixStream::connect(&control).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "Cannot find MPS control daemon process ({}: {e})",
                control.display()
            ),
        )
    })?;
    writeln!(conn, "{}", command.trim())?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    Ok(answer)
}

fn append_log(dir: &Path, text: &str) -> io::Result<()> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("control.log"))?;
    writeln!(file, "[{secs}] {text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_answers_clients_refuses_a_twin_and_leaves_no_socket_after_quit() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs {
            pipe: tmp.path().join("pipe"),
            log: tmp.path().join("log"),
        };
        let defaults = Defaults {
            active_thread_percentage: Some(50.0),
            ..Defaults::default()
        };
        let daemon = {
            let dirs = dirs.clone();
            std::thread::spawn(move || serve(&dirs, defaults, Some("GPU-1")))
        };
        let answer = loop {
            match ask(&dirs.pipe, "get_default_active_thread_percentage") {
                Ok(a) => break a,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        };
        assert_eq!(answer, "50.0\n");
        let twin = serve(&dirs, Defaults::default(), None).unwrap_err();
        assert!(twin.to_string().contains("already serves"), "{twin}");
        assert_eq!(ask(&dirs.pipe, "quit").unwrap(), "");
        daemon.join().unwrap().unwrap();
        assert!(!dirs.control().exists());
        let log = fs::read_to_string(dirs.log.join("control.log")).unwrap();
        assert!(
            log.contains("devices GPU-1, default active thread percentage 50.0"),
            "{log}"
        );
        assert!(log.trim_end().ends_with("Shutdown"), "{log}");
        let gone = ask(&dirs.pipe, "quit").unwrap_err();
        assert!(
            gone.to_string().contains("Cannot find MPS control daemon"),
            "{gone}"
        );
    }
}
