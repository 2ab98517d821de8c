//! The tables of `docs/configuration.md`, generated from the declarations
//! of the parts (`settings!` beside each part's user): each sits between `<!-- generated: PART -->` and
//! `<!-- end -->`, the prose around them is written by hand. The test
//! fails when the file and the code disagree;
//! `UPDATE_DOCS=1 cargo test --lib config::docs` rewrites the tables.

use super::*;
use crate::settings::PartDoc;

/// Every part's documentation, in the order of `docs/configuration.md`.
fn all_parts() -> Vec<PartDoc> {
    vec![
        EngineConfig::doc(),
        SchedConfig::doc(),
        RpcConfig::doc(),
        NotifyLimits::doc(),
        StoreConfig::doc(),
        PeerLimits::doc(),
        AuthConfig::doc(),
        TopologyConfig::doc(),
        EndpointConfig::doc(),
        TcpConfig::doc(),
        ShmConfig::doc(),
        RdmaConfig::doc(),
    ]
}

/// A cell's text with its `|` escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The Markdown table of `part`.
fn table(part: &PartDoc) -> String {
    let mut out =
        String::from("| variable | meaning | default | allowed values |\n|---|---|---|---|\n");
    for row in &part.rows {
        let vars: Vec<String> = row.vars.iter().map(|v| format!("`{v}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            vars.join(" "),
            cell(row.doc),
            cell(&row.default),
            cell(&row.allowed)
        ));
    }
    out
}

/// `text` with the table of every part between its markers; an error
/// names a part whose markers are missing.
fn render(text: &str) -> Result<String, String> {
    let mut out = text.to_string();
    for part in all_parts() {
        let open = format!("<!-- generated: {} -->\n", part.name);
        let Some(start) = out.find(&open).map(|i| i + open.len()) else {
            return Err(format!("no `{}` in docs/configuration.md", open.trim()));
        };
        let Some(len) = out[start..].find("<!-- end -->") else {
            return Err(format!("no `<!-- end -->` after `{}`", open.trim()));
        };
        out.replace_range(start..start + len, &table(&part));
    }
    Ok(out)
}

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");

#[test]
fn tables_match_the_declarations() {
    let text = std::fs::read_to_string(PATH).expect("docs/configuration.md");
    let want = render(&text).unwrap();
    if want == text {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(PATH, &want).expect("write docs/configuration.md");
        return;
    }
    panic!(
        "docs/configuration.md is stale: its tables differ from the settings! declarations; \
         rewrite them with `UPDATE_DOCS=1 cargo test --lib config::docs`"
    );
}

#[test]
fn every_declared_variable_is_documented() {
    let text = std::fs::read_to_string(PATH).expect("docs/configuration.md");
    let parts = all_parts();
    assert!(parts.iter().map(|p| p.rows.len()).sum::<usize>() > 90);
    for part in &parts {
        for row in &part.rows {
            for var in row.vars {
                assert!(
                    text.contains(&format!("`{var}`")),
                    "{var} (part {}) is not in docs/configuration.md",
                    part.name
                );
            }
        }
    }
}

#[test]
fn every_row_says_what_it_takes() {
    for part in all_parts() {
        for row in &part.rows {
            assert!(!row.doc.is_empty() && !row.allowed.is_empty(), "{row:?}");
            assert!(!row.default.is_empty(), "{row:?}");
        }
    }
}
