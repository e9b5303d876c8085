//! `nvidia-cuda-mps-control` for the local cluster's fake driver installs. With `-f` it is the
//! control daemon, in the foreground, serving the pipe directory of `CUDA_MPS_PIPE_DIRECTORY` with
//! the defaults of `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`;
//! without arguments it is the client, sending each line of its input to that daemon and printing
//! the answers, as the driver's tool does. It starts no MPS server: there is no GPU to serve.

mod daemon;
mod defaults;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| default.into(), PathBuf::from)
}

fn main() -> ExitCode {
    let dirs = daemon::Dirs {
        pipe: dir("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
        log: dir("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["-f"] => defaults::Defaults::from_env(|name| std::env::var(name).ok())
            .map_err(|e| e.to_string())
            .and_then(|defaults| {
                let devices = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                daemon::serve(&dirs, defaults, devices.as_deref()).map_err(|e| e.to_string())
            }),
        [] => client(&dirs),
        ["-d"] => Err("this stand-in runs the daemon in the foreground only: use -f".into()),
        _ => Err(format!(
            "usage: nvidia-cuda-mps-control [-f] (got {args:?})"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: {e}");
            ExitCode::FAILURE
        }
    }
}

fn client(dirs: &daemon::Dirs) -> Result<(), String> {
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        print!(
            "{}",
            daemon::ask(&dirs.pipe, &line).map_err(|e| e.to_string())?
        );
    }
    Ok(())
}
