//! Reading the `kind.toml` files: each below its kind's folder, bounded, parsed whole.

use std::path::Path;

use anyhow::{Context as _, bail};

use super::{KindFile, MAX_KIND_FILE_BYTES};
use crate::message::Kind;
use crate::render::KIND_FILE;

/// Every `<kind>/kind.toml` below `dir`: its kind, its path and its text.
pub(super) fn read_kind_files(dir: &Path) -> anyhow::Result<Vec<(Kind, String, String)>> {
    let mut found = Vec::new();
    let unreadable = || format!("cannot read {}", dir.display());
    let mut folders = std::fs::read_dir(dir)
        .with_context(unreadable)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(unreadable)?;
    // In name order: the first of several bad files is the same one at every start.
    folders.sort();
    for folder in folders {
        let path = folder.join(KIND_FILE);
        if !folder.is_dir() || !path.is_file() {
            continue;
        }
        let name = folder.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let shown = path.display().to_string();
        let kind = Kind::parse(&name).with_context(|| format!("{shown}: not a kind's folder"))?;
        if !folder.join("subject.txt").is_file() {
            bail!("{shown}: the kind has no subject.txt beside it");
        }
        found.push((kind, shown.clone(), read_bounded(&path, &shown)?));
    }
    Ok(found)
}

/// A small text file, refused past [`MAX_KIND_FILE_BYTES`].
fn read_bounded(path: &Path, shown: &str) -> anyhow::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {shown}"))?;
    let mut text = String::new();
    file.take(MAX_KIND_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {shown} as UTF-8 text"))?;
    if text.len() as u64 > MAX_KIND_FILE_BYTES {
        bail!("{shown}: longer than {MAX_KIND_FILE_BYTES} bytes");
    }
    Ok(text)
}

pub(super) fn parse_file(path: &str, text: &str) -> anyhow::Result<KindFile> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{path}: {}", e.message()))
}
