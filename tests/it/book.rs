//! The reference under `docs/` is an `mdBook`: it builds, every page its `SUMMARY.md` names
//! exists, and the files at the front door stay short enough to read.

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `mdbook` on `PATH`, or where `cargo install` puts it.
fn mdbook() -> PathBuf {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("mdbook"))
                .collect()
        })
        .unwrap_or_default();
    candidates.extend(
        std::env::var_os("CARGO_HOME").map(|home| PathBuf::from(home).join("bin").join("mdbook")),
    );
    candidates.extend(std::env::var_os("HOME").map(|home| {
        PathBuf::from(home)
            .join(".cargo")
            .join("bin")
            .join("mdbook")
    }));
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "mdbook is not installed: `cargo install mdbook --locked` or `bash .ci/run` installs it"
            )
        })
}

/// The files `SUMMARY.md` links to (`- [Title](file.md)`), in order; a draft chapter's
/// empty link is left out.
fn summary_links(summary: &str) -> Vec<String> {
    summary
        .lines()
        .filter_map(|line| {
            let start = line.find("](")? + 2;
            let end = start + line[start..].find(')')?;
            Some(line[start..end].trim().to_owned())
        })
        .filter(|target| !target.is_empty())
        .collect()
}

#[test]
fn the_book_builds_with_every_page_of_its_summary() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(mdbook())
        .arg("build")
        .arg(manifest("docs"))
        .arg("-d")
        .arg(out.path())
        .output()
        .expect("run mdbook");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "mdbook build docs failed:\n{log}");
    // A missing `{{#include}}` file is logged as an error, and the build goes on without it.
    assert!(
        !log.contains("[ERROR]") && !log.contains("[WARN]"),
        "mdbook build docs complained:\n{log}"
    );

    let summary = std::fs::read_to_string(manifest("docs/src/SUMMARY.md")).unwrap();
    let pages = summary_links(&summary);
    assert!(pages.len() >= 15, "SUMMARY.md links only {pages:?}");
    for page in &pages {
        assert!(
            manifest("docs/src").join(page).is_file(),
            "SUMMARY.md names {page}, which is not in docs/src"
        );
        let html = Path::new(page).with_extension("html");
        assert!(
            out.path().join(&html).is_file(),
            "the built book has no {} for {page}",
            html.display()
        );
        every_link_lands(out.path(), &html);
    }
}

/// Each link of the built page `html` to another page of the book, or to an anchor,
/// reaches a page that exists and an `id` it has.
fn every_link_lands(book: &Path, html: &Path) {
    let text = std::fs::read_to_string(book.join(html)).unwrap();
    // Only the page's own content: mdbook's navigation and scripts link to its files.
    let main = text
        .split_once("<main>")
        .and_then(|(_, rest)| rest.split_once("</main>"))
        .map_or(text.as_str(), |(main, _)| main);
    for link in main
        .split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
    {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
        let target = if file.is_empty() {
            html.to_path_buf()
        } else {
            html.parent().unwrap_or(Path::new("")).join(file)
        };
        let target_text = std::fs::read_to_string(book.join(&target)).unwrap_or_else(|_| {
            panic!(
                "{}: a link to {link}, which is not in the book",
                html.display()
            )
        });
        if !anchor.is_empty() {
            assert!(
                target_text.contains(&format!("id=\"{anchor}\"")),
                "{}: a link to {link}, whose page has no such anchor",
                html.display()
            );
        }
    }
}

#[test]
fn the_alerts_page_lists_every_alert_of_the_rules() {
    let rules = std::fs::read_to_string(manifest("alerts/outboxd.rules.yml")).unwrap();
    let page = std::fs::read_to_string(manifest("docs/src/alerts.md")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 20, "{alerts:?}");
    for alert in alerts {
        assert!(
            page.contains(&format!("| `{alert}` |")),
            "docs/src/alerts.md does not list {alert}"
        );
    }
}

#[test]
fn the_readme_and_the_benchmarks_stay_short() {
    for (file, limit) in [("README.md", 16 * 1024), ("BENCHMARKS.md", 20 * 1024)] {
        let bytes = std::fs::metadata(manifest(file)).unwrap().len();
        assert!(
            bytes <= limit,
            "{file} is {bytes} bytes, more than {limit}: move reference material into the book under docs/"
        );
    }
}

/// Every file under `dir`, as paths relative to the manifest.
fn files_under(dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, found);
        } else {
            let relative = path.strip_prefix(manifest("")).unwrap();
            found.push(relative.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn every_file_in_src_says_what_it_is_in_its_first_line() {
    let mut files = Vec::new();
    files_under(&manifest("src"), &mut files);
    let silent: Vec<&String> = files
        .iter()
        .filter(|file| file.ends_with(".rs"))
        .filter(|file| {
            let text = std::fs::read_to_string(manifest(file)).unwrap_or_default();
            !text.starts_with("//! ")
        })
        .collect();
    assert!(silent.is_empty(), "no `//!` first line: {silent:?}");
}

#[test]
fn the_architecture_map_names_every_folder_in_src() {
    let architecture = std::fs::read_to_string(manifest("ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    files_under(&manifest("src"), &mut files);
    assert!(files.len() > 50, "{files:?}");
    // A folder is named as `src/store/sql/`; a module at the top of `src/` by its file.
    let mut unnamed: Vec<String> = files
        .iter()
        .filter_map(|file| match file.rsplit_once('/') {
            Some(("src", _)) => Some(format!("`{file}`")),
            Some((folder, _)) => Some(format!("`{folder}/`")),
            None => None,
        })
        .filter(|name| !architecture.contains(name.as_str()))
        .collect();
    unnamed.sort();
    unnamed.dedup();
    assert!(
        unnamed.is_empty(),
        "ARCHITECTURE.md's map does not name {unnamed:?}"
    );
}

/// The dispatcher's stages own their state: a lock or an atomic is there only for a value
/// two tasks (or the drain's joined futures) really share, and its comment says so.
#[test]
fn every_lock_in_the_dispatcher_says_who_shares_it() {
    let mut files = Vec::new();
    files_under(&manifest("src/dispatch"), &mut files);
    let mut silent = Vec::new();
    for file in files.iter().filter(|file| file.ends_with(".rs")) {
        let text = std::fs::read_to_string(manifest(file)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let field = line.trim_start().trim_start_matches("pub ");
            let is_lock = field.split_once(": ").is_some_and(|(name, ty)| {
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    && !ty.contains('(')
                    && (ty.contains("Mutex<") || ty.starts_with("Atomic"))
            });
            if !is_lock {
                continue;
            }
            let comment: Vec<&str> = lines[..n]
                .iter()
                .rev()
                .take_while(|above| above.trim_start().starts_with("///"))
                .copied()
                .collect();
            if !comment.iter().any(|line| line.contains("Shared")) {
                silent.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        silent.is_empty(),
        "a lock that does not say who shares it: {silent:#?}"
    );
}

#[test]
fn every_invariant_in_the_architecture_names_its_check() {
    let architecture = std::fs::read_to_string(manifest("ARCHITECTURE.md")).unwrap();
    let (_, invariants) = architecture
        .split_once("\n## Invariants\n")
        .expect("an Invariants section");
    let invariants = invariants.split("\n## ").next().unwrap_or(invariants);
    let bullets: Vec<&str> = invariants.split("\n- ").skip(1).collect();
    assert!(bullets.len() >= 15, "{} invariants", bullets.len());
    for bullet in bullets {
        assert!(
            bullet.contains("Check:"),
            "an invariant names no check: {bullet}"
        );
    }
}
