//! Terminal output: aligned columns like `kubectl get`, colour only on a terminal, and durations
//! the way `kubectl` writes ages.

/// How a cell reads at a glance (colour on a terminal, nothing otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// No colour.
    Plain,
    /// All well (green).
    Good,
    /// Needs a look (yellow).
    Warn,
    /// Broken or blocked (red).
    Bad,
}

/// One cell of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// What it says.
    pub text: String,
    /// Its tone.
    pub tone: Tone,
}

impl Cell {
    /// A cell of `tone`.
    pub fn new(text: impl Into<String>, tone: Tone) -> Self {
        Self {
            text: text.into(),
            tone,
        }
    }

    /// A plain cell; empty text reads `-`.
    pub fn plain(text: impl Into<String>) -> Self {
        let text = text.into();
        Self::new(if text.is_empty() { "-".into() } else { text }, Tone::Plain)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::plain(text)
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell::plain(text)
    }
}

/// The table with `headers` over `rows`, columns three spaces apart, in colour when `colour`.
pub fn render(headers: &[&str], rows: &[Vec<Cell>], colour: bool) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.text.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<Cell> = headers.iter().map(|h| Cell::plain(*h)).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            let last = i + 1 == row.len();
            let pad = if last {
                String::new()
            } else {
                " ".repeat(width - cell.text.chars().count() + 3)
            };
            line.push_str(&paint(&cell.text, cell.tone, colour));
            line.push_str(&pad);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` in the colour of `tone` (ANSI) when `colour`.
pub fn paint(text: &str, tone: Tone, colour: bool) -> String {
    let code = match tone {
        _ if !colour => return text.to_owned(),
        Tone::Plain => return text.to_owned(),
        Tone::Good => 32,
        Tone::Warn => 33,
        Tone::Bad => 31,
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// A duration as `kubectl` writes ages: `45s`, `3m10s`, `2h5m`, `3d4h`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_colour_only_when_asked() {
        let rows = vec![
            vec![Cell::plain("gpu-node-1"), Cell::new("2/2", Tone::Good)],
            vec![Cell::plain("n2"), Cell::new("0/1", Tone::Bad)],
        ];
        assert_eq!(
            render(&["NODE", "GPUS"], &rows, false),
            "NODE         GPUS\ngpu-node-1   2/2\nn2           0/1\n"
        );
        let coloured = render(&["NODE", "GPUS"], &rows, true);
        assert!(coloured.contains("\x1b[31m0/1\x1b[0m"), "{coloured}");
        assert!(coloured.starts_with("NODE         GPUS\n"), "{coloured}");
        assert_eq!(Cell::plain("").text, "-");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(-3), "0s");
        assert_eq!(age(59), "59s");
        assert_eq!(age(190), "3m10s");
        assert_eq!(age(7500), "2h5m");
        assert_eq!(age(3 * 86400 + 4 * 3600 + 5), "3d4h");
    }
}
