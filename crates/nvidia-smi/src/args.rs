//! The command lines the stand-in understands.

use nvml_wrapper::enum_wrappers::device::ComputeMode;

/// What to do.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// No argument: versions and GPUs.
    Summary,
    /// `-L`.
    List,
    /// `-i <ids> -c <mode>`.
    SetComputeMode {
        /// GPUs named (all when empty).
        ids: Vec<String>,
        /// The mode.
        mode: ComputeMode,
    },
    /// `compute-policy --set-timeslice <0-3>`.
    SetTimeslice {
        /// GPUs named (all when empty).
        ids: Vec<String>,
        /// 0 default, 1 short, 2 medium, 3 long.
        value: u32,
    },
    /// `compute-policy -l`.
    ListPolicy {
        /// GPUs named (all when empty).
        ids: Vec<String>,
    },
}

/// Reads the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut words = args.iter().map(String::as_str);
    let mut ids = Vec::new();
    let mut policy = false;
    let mut mode = None;
    let mut timeslice = None;
    let mut list_policy = false;
    let mut list = false;
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (word, None),
        };
        let mut value = |name: &str| {
            inline
                .map(str::to_owned)
                .or_else(|| words.next().map(str::to_owned))
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag {
            "compute-policy" if !policy => policy = true,
            "-L" | "--list-gpus" => list = true,
            "-i" | "--id" => ids.extend(value(flag)?.split(',').map(str::to_owned)),
            "-c" | "--compute-mode" => mode = Some(compute_mode(&value(flag)?)?),
            "--set-timeslice" if policy => timeslice = Some(timeslice_value(&value(flag)?)?),
            "-l" | "--list" if policy => list_policy = true,
            other => return Err(format!("unsupported argument {other:?}")),
        }
    }
    match (policy, mode, timeslice, list_policy, list) {
        (false, None, None, false, false) if ids.is_empty() => Ok(Command::Summary),
        (false, None, None, false, true) if ids.is_empty() => Ok(Command::List),
        (false, Some(mode), None, false, false) => Ok(Command::SetComputeMode { ids, mode }),
        (true, None, Some(value), false, false) => Ok(Command::SetTimeslice { ids, value }),
        (true, None, None, true, false) => Ok(Command::ListPolicy { ids }),
        _ => Err(format!("unsupported combination of arguments {args:?}")),
    }
}

fn compute_mode(text: &str) -> Result<ComputeMode, String> {
    match text.to_ascii_uppercase().as_str() {
        "0" | "DEFAULT" => Ok(ComputeMode::Default),
        "2" | "PROHIBITED" => Ok(ComputeMode::Prohibited),
        "3" | "EXCLUSIVE_PROCESS" => Ok(ComputeMode::ExclusiveProcess),
        _ => Err(format!(
            "compute mode {text:?}: expected DEFAULT, PROHIBITED or EXCLUSIVE_PROCESS (0, 2, 3)"
        )),
    }
}

fn timeslice_value(text: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|v| *v <= 3)
        .ok_or_else(|| format!("timeslice {text:?}: expected 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG"))
}

/// The name nvidia-smi prints for a compute mode.
pub fn compute_mode_name(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "DEFAULT",
        ComputeMode::ExclusiveThread => "EXCLUSIVE_THREAD",
        ComputeMode::Prohibited => "PROHIBITED",
        ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
    }
}

/// The name nvidia-smi prints for a time-slice value.
pub fn timeslice_name(value: u32) -> &'static str {
    match value {
        0 => "DEFAULT",
        1 => "SHORT",
        2 => "MEDIUM",
        3 => "LONG",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Result<Command, String> {
        parse(
            &line
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn the_plugins_command_lines_parse() {
        assert_eq!(
            parsed("-i GPU-a -c DEFAULT"),
            Ok(Command::SetComputeMode {
                ids: vec!["GPU-a".into()],
                mode: ComputeMode::Default
            })
        );
        assert_eq!(
            parsed("compute-policy -i GPU-a,1 --set-timeslice 2"),
            Ok(Command::SetTimeslice {
                ids: vec!["GPU-a".into(), "1".into()],
                value: 2
            })
        );
        assert_eq!(
            parsed("compute-policy --set-timeslice=1"),
            Ok(Command::SetTimeslice {
                ids: vec![],
                value: 1
            })
        );
        assert_eq!(
            parsed("compute-policy -l -i 0"),
            Ok(Command::ListPolicy {
                ids: vec!["0".into()]
            })
        );
        assert_eq!(parsed(""), Ok(Command::Summary));
        assert_eq!(parsed("-L"), Ok(Command::List));
    }

    #[test]
    fn bad_command_lines_name_the_problem() {
        assert!(
            parsed("compute-policy --set-timeslice 4")
                .unwrap_err()
                .contains("0=DEFAULT")
        );
        assert!(
            parsed("--set-timeslice 1")
                .unwrap_err()
                .contains("unsupported argument")
        );
        assert!(parsed("-c").unwrap_err().contains("needs a value"));
        assert!(
            parsed("compute-policy")
                .unwrap_err()
                .contains("combination")
        );
    }
}
