//! Architects' names for classes: `penrose-design label CLASS "bert-train"`.
//!
//! A class is named by its id, short and stable along the archive's chains (a restored chain
//! descends from the one followed, so its ids mean the same applications). A label is an
//! architect's note on top: kept in the archive directory, in the design server's own store,
//! never sent anywhere, and shown by every report format.
//!
//! The file `ARCHIVE/labels` (mode 0600, written atomically) is a version line, then one
//! class per line, its id and its label separated by a tab:
//!
//! ```text
//! penrose-design labels 1
//! 7<TAB>bert-train        (<TAB>: one tab character)
//! ```
//!
//! A label is 1 to 64 characters, none of them a control character (so no tab or newline) or
//! an invisible formatting one (zero-width, bidirectional override).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::archive::{self, Archive, ArchiveError};

/// The file's first line.
const HEADER: &str = "penrose-design labels 1";
/// The file's name in the archive directory.
const FILE: &str = "labels";
/// The longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 64;

/// Why a label is refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LabelError {
    /// No characters.
    #[error("a label cannot be empty")]
    Empty,
    /// Over [`MAX_LABEL_CHARS`].
    #[error("a label has at most {MAX_LABEL_CHARS} characters, this one {0}")]
    TooLong(usize),
    /// A control character (tab, newline, escape...).
    #[error("a label holds printable characters only, this one {0:?}")]
    NotPrintable(char),
}

/// A validated label: 1 to 64 characters, no control or invisible formatting character. A
/// string in JSON, checked again when read back (`labels --json`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct Label(String);

impl Label {
    /// Checks `text`.
    pub fn new(text: &str) -> Result<Self, LabelError> {
        let chars = text.chars().count();
        if chars == 0 {
            return Err(LabelError::Empty);
        }
        if chars > MAX_LABEL_CHARS {
            return Err(LabelError::TooLong(chars));
        }
        if let Some(c) = text.chars().find(|&c| c.is_control() || invisible(c)) {
            return Err(LabelError::NotPrintable(c));
        }
        Ok(Self(text.to_owned()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Label {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::new(&text).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Label {
    type Err = LabelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// Invisible formatting characters that would hide or reorder what a label shows (zero-width
/// characters, bidirectional overrides and isolates, the byte order mark).
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// Every class's label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(BTreeMap<u32, Label>);

impl Labels {
    /// The label of `class`, if any.
    pub fn get(&self, class: u32) -> Option<&Label> {
        self.0.get(&class)
    }

    /// Sets (or with `None` removes) the label of `class`; returns the one it replaces.
    pub fn set(&mut self, class: u32, label: Option<Label>) -> Option<Label> {
        match label {
            Some(l) => self.0.insert(class, l),
            None => self.0.remove(&class),
        }
    }

    /// Every (class, label), by class.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Label)> {
        self.0.iter().map(|(c, l)| (*c, l))
    }

    /// No labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The file's text.
    fn to_text(&self) -> String {
        let mut out = format!("{HEADER}\n");
        for (class, label) in &self.0 {
            out.push_str(&format!("{class}\t{label}\n"));
        }
        out
    }

    /// Parses the file's text; `Err` says what is wrong, with the line.
    fn parse(text: &str) -> Result<Self, String> {
        let mut lines = text.lines();
        match lines.next() {
            Some(HEADER) => {}
            other => {
                return Err(format!(
                    "not a labels file of version 1 (first line {other:?}, expected {HEADER:?})"
                ));
            }
        }
        let mut labels = BTreeMap::new();
        for (i, line) in lines.enumerate() {
            let n = i + 2;
            let (class, label) = line
                .split_once('\t')
                .ok_or_else(|| format!("line {n}: no tab between class and label"))?;
            let class: u32 = class
                .parse()
                .map_err(|_| format!("line {n}: {class:?} is not a class id"))?;
            let label = Label::new(label).map_err(|e| format!("line {n}: {e}"))?;
            if labels.insert(class, label).is_some() {
                return Err(format!("line {n}: class {class} labelled twice"));
            }
        }
        Ok(Self(labels))
    }
}

impl Archive {
    fn labels_path(&self) -> PathBuf {
        self.dir().join(FILE)
    }

    /// The labels kept in this archive (none when the file does not exist).
    pub fn labels(&self) -> Result<Labels, ArchiveError> {
        let path = self.labels_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Labels::default()),
            Err(e) => return Err(archive::io(&path)(e)),
        };
        Labels::parse(&text).map_err(|why| ArchiveError::Labels { path, why })
    }

    /// Sets (`Some`) or removes (`None`) the label of `class`, rewriting the file atomically
    /// with mode 0600; returns the label it replaces. A class that no imported bundle holds
    /// is refused (a typo would otherwise label nothing); removing needs no such check.
    pub fn set_label(
        &self,
        class: u32,
        label: Option<Label>,
    ) -> Result<Option<Label>, ArchiveError> {
        let path = self.labels_path();
        if label.is_some() {
            let merged = self.merged()?;
            if !merged.entries.keys().any(|k| k.class.0 == class) {
                return Err(ArchiveError::Labels {
                    path,
                    why: format!("class {class} is in no imported bundle; nothing to label"),
                });
            }
        }
        let mut labels = self.labels()?;
        let old = labels.set(class, label);
        penrose_host::durable::replace(
            &path,
            labels.to_text().as_bytes(),
            penrose_host::durable::Access::Owner,
        )?;
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_one_to_64_printable_characters() {
        assert_eq!(Label::new("bert-train").unwrap().as_str(), "bert-train");
        assert_eq!(Label::new(""), Err(LabelError::Empty));
        assert!(Label::new(&"é".repeat(64)).is_ok(), "characters, not bytes");
        assert_eq!(Label::new(&"x".repeat(65)), Err(LabelError::TooLong(65)));
        assert_eq!(Label::new("a\tb"), Err(LabelError::NotPrintable('\t')));
        assert_eq!(Label::new("a\nb"), Err(LabelError::NotPrintable('\n')));
        assert_eq!(
            Label::new("\u{1b}[31m"),
            Err(LabelError::NotPrintable('\u{1b}'))
        );
        assert_eq!(
            Label::new("a\u{202E}b"),
            Err(LabelError::NotPrintable('\u{202E}'))
        );
        assert!(
            Label::new("<script>alert(1)</script> & co").is_ok(),
            "escaped where shown"
        );
    }

    #[test]
    fn the_file_round_trips_and_damage_is_reported_with_its_line() {
        let mut labels = Labels::default();
        labels.set(7, Some(Label::new("bert train").unwrap()));
        labels.set(3, Some(Label::new("<b>&").unwrap()));
        let text = labels.to_text();
        assert!(text.starts_with("penrose-design labels 1\n3\t<b>&\n7\tbert train\n"));
        assert_eq!(Labels::parse(&text), Ok(labels.clone()));
        assert_eq!(labels.set(3, None).map(|l| l.0), Some("<b>&".to_string()));
        assert!(Labels::parse("").unwrap_err().contains("version 1"));
        assert!(Labels::parse("penrose-design labels 2\n").is_err());
        let bad = Labels::parse("penrose-design labels 1\nx\ty\n").unwrap_err();
        assert!(bad.contains("line 2"), "{bad}");
        assert!(Labels::parse("penrose-design labels 1\n1\ta\n1\tb\n").is_err());
    }
}
