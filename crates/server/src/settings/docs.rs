//! The settings table as docs/CONFIG.md and `--help` show it.
//!
//! docs/CONFIG.md holds the rendered table between two marker lines; a
//! test fails when the committed file differs from what [`markdown`]
//! renders now, and rewrites it when run with `BERTH_UPDATE_DOCS=1`.

use super::slot::Shape;
use super::{all, Setting};

/// The settings table in markdown, one row per setting, in table order.
pub fn markdown() -> String {
    let mut out = String::from("| key | flag | default | meaning |\n|---|---|---|---|\n");
    for s in all() {
        let default = match (s.slot.default_text(), s.default_note) {
            (None, _) => "none".to_owned(),
            (Some(v), "") => format!("`{v}`"),
            (Some(v), note) => format!("`{v}` ({note})"),
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {default} | {} |\n",
            s.key,
            s.usage().replace('|', "\\|"),
            s.doc
        ));
    }
    out
}

impl Setting {
    /// The flag as it is typed: `--sync always|interval|never`,
    /// `--data-dir DIR`, `--reshape`.
    pub fn usage(&self) -> String {
        if self.slot.shape() == Shape::Switch {
            return format!("--{}", self.flag);
        }
        let names = self.slot.names();
        if names.is_empty() {
            format!("--{} {}", self.flag, self.value_name)
        } else {
            format!("--{} {}", self.flag, names.join("|"))
        }
    }

    /// The doc as plain text for `--help`: no backticks, links as their
    /// text.
    pub fn help(&self) -> String {
        let mut out = String::with_capacity(self.doc.len());
        let mut rest = self.doc;
        while let Some(open) = rest.find('[') {
            let link = rest[open..]
                .find("](")
                .and_then(|mid| rest[open + mid..].find(')').map(|close| (mid, mid + close)));
            let Some((mid, close)) = link else { break };
            out.push_str(&rest[..open]);
            out.push_str(&rest[open + 1..open + mid]);
            rest = &rest[open + close + 1..];
        }
        out.push_str(rest);
        out.replace('`', "")
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// The line before the generated table in docs/CONFIG.md.
    const BEGIN: &str = "<!-- settings: generated from crates/server/src/settings; \
     update with BERTH_UPDATE_DOCS=1 cargo test --release -p berth-server settings -->";
    /// The line after it.
    const END: &str = "<!-- end of settings -->";

    fn config_md() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/CONFIG.md")
    }

    /// The docs list every setting with its flag, default and doc, and no
    /// other: what CONFIG.md shows is the table.
    #[test]
    fn config_md_shows_exactly_the_settings_table() {
        let path = config_md();
        let text = std::fs::read_to_string(&path).unwrap();
        let (before, rest) = text
            .split_once(BEGIN)
            .expect("CONFIG.md has the BEGIN marker");
        let (_, after) = rest.split_once(END).expect("CONFIG.md has the END marker");
        let wanted = format!("{before}{BEGIN}\n\n{}\n{END}{after}", markdown());
        if std::env::var_os("BERTH_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &wanted).unwrap();
            return;
        }
        assert!(
            text == wanted,
            "docs/CONFIG.md does not show the settings table; if the table is right, run \
             BERTH_UPDATE_DOCS=1 cargo test --release -p berth-server settings"
        );
    }

    #[test]
    fn docs_cannot_break_the_markdown_table() {
        for s in all() {
            assert!(!s.doc.contains('|'), "{}: a '|' in its doc", s.key);
            assert!(!s.doc.contains('\n'), "{}: a line break in its doc", s.key);
        }
    }

    #[test]
    fn help_is_the_doc_without_markup() {
        let s = super::super::find("store.sync").unwrap();
        let help = s.help();
        assert!(help.contains("See DURABILITY.md."), "{help}");
        assert!(!help.contains('`') && !help.contains("]("), "{help}");
        assert_eq!(s.usage(), "--sync always|interval|never");
        assert_eq!(
            super::super::find("store.reshape").unwrap().usage(),
            "--reshape"
        );
    }
}
