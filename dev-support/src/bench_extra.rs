//! Side outputs of the benches: what criterion does not record (OOM counts, peak memory, driver
//! calls, why a part was skipped), written as JSON to `<target>/bench-extra/<bench>.json`, where
//! `replay/examples/bench_report` reads them next to criterion's estimates to write BENCHMARKS.md.
//! Used by the benches of both crates (the library's and the replay crate's).
//!
//! `<target>` is `$CARGO_TARGET_DIR`, else the workspace's `target` (the folder holding
//! `Cargo.lock` above the bench's package), where criterion writes `<target>/criterion`. The
//! JSON is written by hand: the library's benches have no serde_json.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A JSON value.
#[derive(Clone)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// An object from `(key, value)` pairs, in order.
    pub fn obj<K: Into<String>>(fields: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Obj(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    fn render(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) if n.is_finite() => write!(out, "{n}").expect("write to a String"),
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => {
                out.push('"');
                for ch in s.chars() {
                    match ch {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        c if (c as u32) < 0x20 => {
                            write!(out, "\\u{:04x}", c as u32).expect("write to a String")
                        }
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.render(out);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    Json::Str(k.clone()).render(out);
                    out.push(':');
                    v.render(out);
                }
                out.push('}');
            }
        }
    }
}

impl From<u64> for Json {
    fn from(n: u64) -> Json {
        Json::Num(n as f64)
    }
}

impl From<usize> for Json {
    fn from(n: usize) -> Json {
        Json::Num(n as f64)
    }
}

impl From<f64> for Json {
    fn from(n: f64) -> Json {
        Json::Num(n)
    }
}

impl From<bool> for Json {
    fn from(b: bool) -> Json {
        Json::Bool(b)
    }
}

impl From<&str> for Json {
    fn from(s: &str) -> Json {
        Json::Str(s.to_string())
    }
}

impl From<String> for Json {
    fn from(s: String) -> Json {
        Json::Str(s)
    }
}

/// `<target>/bench-extra`.
pub fn dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // The package root, or the workspace root above it (one level for replay/).
            let package = Path::new(env!("CARGO_MANIFEST_DIR"));
            let root = package
                .ancestors()
                .find(|d| d.join("Cargo.lock").is_file())
                .unwrap_or(package);
            root.join("target")
        })
        .join("bench-extra")
}

/// Writes `value` to `<target>/bench-extra/<name>.json`. A failure is printed, never fatal: the
/// measurements themselves are in criterion's files.
pub fn write(name: &str, value: &Json) {
    let mut text = String::new();
    value.render(&mut text);
    text.push('\n');
    let dir = dir();
    let path = dir.join(format!("{name}.json"));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        println!("note: could not write {}: {e}", path.display());
    }
}

/// What one replay of a trace needed: deterministic, so measured once, untimed.
pub struct Needed {
    pub events: u64,
    pub ooms: u64,
    pub peak_reserved: u64,
    pub peak_live: u64,
}

impl Needed {
    /// Prints one line for `group`'s case and returns the side output's record of it.
    pub fn report(&self, group: &str, allocator: &str, case: &str) -> Json {
        const MIB: f64 = (1u64 << 20) as f64;
        println!(
            "{group} {allocator} {case}: {} events, {} OOMs, peak reserved {:.1} MiB, peak live {:.1} MiB",
            self.events,
            self.ooms,
            self.peak_reserved as f64 / MIB,
            self.peak_live as f64 / MIB,
        );
        Json::obj([
            ("allocator", allocator.into()),
            ("case", case.into()),
            ("events", self.events.into()),
            ("ooms", self.ooms.into()),
            ("peak_reserved_bytes", self.peak_reserved.into()),
            ("peak_live_bytes", self.peak_live.into()),
        ])
    }
}
