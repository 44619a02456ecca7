//! Loading templates: the built-in sets embedded in the binary, and a directory's.

use std::path::Path;

use minijinja::Environment;

use super::TemplateLoadError;
use crate::message::Kind;

/// The templates shipped in the binary, for the kinds the first application sends.
pub(super) const BUILTIN_TEMPLATES: &[(&str, &str)] = &[
    ("_layout.html", include_str!("../../templates/_layout.html")),
    (
        "account_verification/subject.txt",
        include_str!("../../templates/account_verification/subject.txt"),
    ),
    (
        "account_verification/body.txt",
        include_str!("../../templates/account_verification/body.txt"),
    ),
    (
        "account_verification/body.html",
        include_str!("../../templates/account_verification/body.html"),
    ),
    (
        "workspace_invite/subject.txt",
        include_str!("../../templates/workspace_invite/subject.txt"),
    ),
    (
        "workspace_invite/body.txt",
        include_str!("../../templates/workspace_invite/body.txt"),
    ),
    (
        "workspace_invite/body.html",
        include_str!("../../templates/workspace_invite/body.html"),
    ),
    (
        "invoice_notice/subject.txt",
        include_str!("../../templates/invoice_notice/subject.txt"),
    ),
    (
        "invoice_notice/body.txt",
        include_str!("../../templates/invoice_notice/body.txt"),
    ),
    (
        "invoice_notice/body.html",
        include_str!("../../templates/invoice_notice/body.html"),
    ),
];

/// The built-in kinds' settings (`<kind>/kind.toml`), which `config::kinds` reads: a
/// directory's `kind.toml` of the same kind replaces one.
pub(crate) const BUILTIN_KIND_FILES: &[(&str, &str)] = &[
    (
        "account_verification",
        include_str!("../../templates/account_verification/kind.toml"),
    ),
    (
        "workspace_invite",
        include_str!("../../templates/workspace_invite/kind.toml"),
    ),
    (
        "invoice_notice",
        include_str!("../../templates/invoice_notice/kind.toml"),
    ),
];

/// A kind's settings file, beside its templates; not a template.
pub(crate) const KIND_FILE: &str = "kind.toml";

pub(super) fn add_template(
    env: &mut Environment<'static>,
    name: String,
    source: String,
) -> Result<(), TemplateLoadError> {
    env.add_template_owned(name.clone(), source)
        .map_err(|source| TemplateLoadError::Syntax { name, source })
}

/// Reads every file below `dir` as a template named by its relative path, so that
/// templates can `{% extends %}` and `{% include %}` each other.
pub(super) fn read_template_dir(dir: &Path) -> Result<Vec<(String, String)>, TemplateLoadError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| TemplateLoadError::Io { path, source }
    };
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).map_err(io(&current))? {
            let path = entry.map_err(io(&current))?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(dir)
                .map_err(|e| TemplateLoadError::Layout(path.display().to_string(), e.to_string()))?
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            if relative.split('/').any(|part| part.starts_with('.'))
                || relative.ends_with(&format!("/{KIND_FILE}"))
            {
                continue;
            }
            if let Some((kind, _)) = relative.rsplit_once('/')
                && relative.ends_with("/subject.txt")
            {
                Kind::parse(kind).map_err(|e| {
                    TemplateLoadError::Layout(path.display().to_string(), e.to_string())
                })?;
            }
            let source = std::fs::read_to_string(&path).map_err(io(&path))?;
            out.push((relative, source));
        }
    }
    if !out.iter().any(|(name, _)| name.ends_with("/subject.txt")) {
        return Err(TemplateLoadError::Layout(
            dir.display().to_string(),
            "holds no <kind>/subject.txt".to_owned(),
        ));
    }
    Ok(out)
}
