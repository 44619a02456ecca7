//! The schema of this process's statements (`OUTBOXD_SCHEMA`): set once at start, and each
//! statement's text put in it once, the first time it is sent, and kept. How a text is put
//! in a schema, and why a `search_path` will not do, is the producer crate's
//! ([`outboxd_producer::schema`]), so that its `enqueue` and outboxd agree. Without a
//! schema, the text goes out unchanged and this costs one load.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, OnceLock};

use sqlx::{SqlSafeStr, SqlStr};

pub use outboxd_producer::schema::{InvalidSchema, OBJECTS, Schema, qualify};

static SCHEMA: OnceLock<Option<Schema>> = OnceLock::new();

/// Statements qualified so far, by their text as written: a bounded set, since every
/// statement's text comes from this crate (a few vary, each over a fixed set of words).
static QUALIFIED: LazyLock<Mutex<HashMap<String, &'static str>>> = LazyLock::new(Default::default);

/// Sets the schema of this process's statements, once, before the first is sent (as the
/// route to the database is set, in `statements`). Later calls must agree with the first.
pub fn use_schema(schema: Option<&Schema>) {
    let set = SCHEMA.get_or_init(|| schema.cloned());
    debug_assert_eq!(set.as_ref(), schema, "one schema per process");
}

/// The schema set by [`use_schema`], if any.
pub fn current() -> Option<&'static Schema> {
    SCHEMA.get().and_then(Option::as_ref)
}

/// `object` (one of [`OBJECTS`], or a function's signature) as a statement or a catalog
/// lookup names it.
pub fn qualified(object: &str) -> String {
    match current() {
        Some(schema) => format!("{}.{object}", schema.quoted()),
        None => object.to_owned(),
    }
}

/// `sql` with outboxd's objects in the schema, when one is set.
pub(super) fn in_schema(sql: impl SqlSafeStr) -> SqlStr {
    let sql = sql.into_sql_str();
    let Some(schema) = current() else {
        return sql;
    };
    let mut cache = QUALIFIED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let text = match cache.get(sql.as_str()) {
        Some(text) => *text,
        None => {
            let text: &'static str = Box::leak(qualify(sql.as_str(), schema).into_boxed_str());
            cache.insert(sql.as_str().to_owned(), text);
            text
        }
    };
    SqlStr::from_static(text)
}
