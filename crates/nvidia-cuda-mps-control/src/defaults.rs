//! The defaults a control daemon hands to the MPS servers it starts, as its environment gives them
//! (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`), and the control
//! commands that read and change them. Pure: no I/O.

use std::collections::BTreeMap;

/// What the daemon starts servers with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Defaults {
    /// The share of each GPU's threads a client may use, in percent; `None`: all.
    pub active_thread_percentage: Option<f64>,
    /// Pinned device memory limit per device (its index or UUID, as written), e.g. `10G`.
    pub pinned_mem_limits: BTreeMap<String, String>,
}

impl Defaults {
    /// Reads the two variables from `var` (the environment, in the binary); a malformed value is
    /// an error naming it, as the daemon would refuse to start with it.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut defaults = Self::default();
        if let Some(text) = var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") {
            defaults.active_thread_percentage = Some(percentage(&text)?);
        }
        if let Some(text) = var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") {
            for entry in text.split(',').filter(|e| !e.trim().is_empty()) {
                let (device, limit) = entry
                    .split_once('=')
                    .filter(|(d, l)| !d.trim().is_empty() && is_limit(l.trim()))
                    .ok_or_else(|| {
                        format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: {entry:?} is not DEVICE=LIMIT (0=10G)")
                    })?;
                defaults
                    .pinned_mem_limits
                    .insert(device.trim().to_owned(), limit.trim().to_owned());
            }
        }
        Ok(defaults)
    }

    /// Answers one control command (a line a client sent).
    pub fn answer(&mut self, line: &str) -> Reply {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["quit"] => Reply::Quit,
            ["get_default_active_thread_percentage"] => Reply::Text(format!(
                "{:.1}",
                self.active_thread_percentage.unwrap_or(100.0)
            )),
            ["set_default_active_thread_percentage", value] => match percentage(value) {
                Ok(p) => {
                    self.active_thread_percentage = Some(p);
                    Reply::Text(format!("{p:.1}"))
                }
                Err(e) => Reply::Text(e),
            },
            ["get_default_device_pinned_mem_limit", device] => Reply::Text(
                self.pinned_mem_limits
                    .get(*device)
                    .cloned()
                    .unwrap_or_else(|| "none".into()),
            ),
            ["set_default_device_pinned_mem_limit", device, limit] if is_limit(limit) => {
                self.pinned_mem_limits
                    .insert((*device).to_owned(), (*limit).to_owned());
                Reply::Text((*limit).to_owned())
            }
            _ => Reply::Text(format!("Unknown command: {}", line.trim())),
        }
    }
}

/// What the daemon does after a command.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Sends this line back and keeps serving.
    Text(String),
    /// Stops: removes its control socket and exits.
    Quit,
}

fn percentage(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|p| *p > 0.0 && *p <= 100.0)
        .ok_or_else(|| {
            format!("active thread percentage {text:?}: expected a number above 0, at most 100")
        })
}

/// `10G`, `512M`, `1024K` or a number of bytes.
fn is_limit(text: &str) -> bool {
    let digits = text.trim_end_matches(['K', 'M', 'G', 'k', 'm', 'g']);
    !digits.is_empty()
        && digits.len() + 1 >= text.len()
        && digits.chars().all(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn the_environment_sets_the_defaults_the_commands_report() {
        let mut d = Defaults::from_env(env(&[
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=10G,GPU-1=512M"),
        ]))
        .unwrap();
        assert_eq!(
            d.answer("get_default_active_thread_percentage"),
            Reply::Text("50.0".into())
        );
        assert_eq!(
            d.answer("get_default_device_pinned_mem_limit 0"),
            Reply::Text("10G".into())
        );
        assert_eq!(
            d.answer("get_default_device_pinned_mem_limit GPU-1"),
            Reply::Text("512M".into())
        );
        assert_eq!(
            d.answer("get_default_device_pinned_mem_limit 2"),
            Reply::Text("none".into())
        );
        assert_eq!(d.answer(" quit \n"), Reply::Quit);
    }

    #[test]
    fn without_settings_a_client_gets_every_thread_and_commands_change_them() {
        let mut d = Defaults::from_env(env(&[])).unwrap();
        assert_eq!(
            d.answer("get_default_active_thread_percentage"),
            Reply::Text("100.0".into())
        );
        assert_eq!(
            d.answer("set_default_active_thread_percentage 25"),
            Reply::Text("25.0".into())
        );
        assert_eq!(
            d.answer("get_default_active_thread_percentage"),
            Reply::Text("25.0".into())
        );
        assert_eq!(
            d.answer("set_default_device_pinned_mem_limit 1 2G"),
            Reply::Text("2G".into())
        );
        assert_eq!(
            d.answer("get_default_device_pinned_mem_limit 1"),
            Reply::Text("2G".into())
        );
        assert!(
            matches!(d.answer("start_server -uid 0"), Reply::Text(t) if t.starts_with("Unknown command"))
        );
    }

    #[test]
    fn malformed_settings_are_named() {
        for (name, value) in [
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "0"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "half"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "10G"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=ten"),
        ] {
            let err = Defaults::from_env(env(&[(name, value)])).unwrap_err();
            assert!(
                err.contains(value) || err.contains(name),
                "{name}={value}: {err}"
            );
        }
    }
}
