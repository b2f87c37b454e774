//! A command's result on stdout, as text for people or as JSON for scripts (`--json`): every
//! CLI prints its results through here, so that `--json` means the same everywhere (one
//! pretty-printed JSON value, nothing else on stdout).

use std::fmt::Display;
use std::io::Write as _;

use serde::Serialize;

/// Prints `value` as pretty JSON when `json`, else its text form (a final newline added when
/// the text has none; no text prints nothing).
pub fn print<T: Serialize + Display>(value: &T, json: bool) -> std::io::Result<()> {
    print_with(value, json, |value| value.to_string())
}

/// Prints `value` as pretty JSON when `json`, else the text `text` makes of it (a final
/// newline added when the text has none; no text prints nothing).
pub fn print_with<T: Serialize>(
    value: &T,
    json: bool,
    text: impl FnOnce(&T) -> String,
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    write_to(&mut out, value, json, text)?;
    out.flush()
}

fn write_to<T: Serialize>(
    out: &mut impl std::io::Write,
    value: &T,
    json: bool,
    text: impl FnOnce(&T) -> String,
) -> std::io::Result<()> {
    let mut text = if json {
        serde_json::to_string_pretty(value).map_err(std::io::Error::other)?
    } else {
        text(value)
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    out.write_all(text.as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Count {
        reports: u64,
    }

    fn written(json: bool, text: &str) -> String {
        let mut out = Vec::new();
        write_to(&mut out, &Count { reports: 3 }, json, |c| {
            format!("{} reports{text}", c.reports)
        })
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn text_ends_in_one_newline_and_json_is_the_value() {
        assert_eq!(written(false, ""), "3 reports\n");
        assert_eq!(written(false, "\n"), "3 reports\n");
        let mut out = Vec::new();
        write_to(&mut out, &Count { reports: 3 }, false, |_| String::new()).unwrap();
        assert!(
            out.is_empty(),
            "nothing to say prints nothing, not an empty line"
        );
        let json: serde_json::Value = serde_json::from_str(&written(true, "")).unwrap();
        assert_eq!(json["reports"], 3);
    }
}
