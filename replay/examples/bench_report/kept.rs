//! Hand-written notes that survive regeneration.
//!
//! Some of BENCHMARKS.md is analysis no bench result can produce: where the time goes (a
//! profile), a measurement taken outside criterion, why a target is missed. Such text is
//! wrapped in BENCHMARKS.md between `<!-- kept: NAME -->` and `<!-- end kept: NAME -->`. Before
//! writing, the generator reads the file it is about to replace, takes every kept block and
//! puts it back at the end of the section (`## ` heading) it was in; a block whose section the
//! new report no longer has goes at the end, under a heading that says so. So a full
//! `scripts/benchmarks.sh` run renews every figure it measures and loses no analysis, and
//! nothing outside the markers is ever copied over from the old file.

/// One kept block: its name, the section it belongs to, and its text (markers included).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Kept {
    pub(crate) name: String,
    /// The `## ` heading line of the section it was in (`None` before the first heading).
    pub(crate) section: Option<String>,
    pub(crate) text: String,
}

const OPEN: &str = "<!-- kept: ";
const CLOSE: &str = "<!-- end kept: ";

/// The name of a marker line (`<!-- kept: NAME -->` with `prefix` = [`OPEN`]).
fn marker<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.trim()
        .strip_prefix(prefix)?
        .strip_suffix("-->")
        .map(str::trim)
}

/// Every kept block of `old`, in order. An unclosed block is an error naming it: better to stop
/// than to drop half of someone's notes.
pub(crate) fn extract(old: &str) -> Result<Vec<Kept>, String> {
    let mut kept = Vec::new();
    let mut section: Option<String> = None;
    let mut open: Option<(String, String)> = None;
    for line in old.lines() {
        if let Some((name, text)) = &mut open {
            text.push_str(line);
            text.push('\n');
            if marker(line, CLOSE) == Some(name.as_str()) {
                let (name, text) = open.take().expect("open block");
                kept.push(Kept {
                    name,
                    section: section.clone(),
                    text,
                });
            }
            continue;
        }
        if let Some(name) = marker(line, OPEN) {
            open = Some((name.to_string(), format!("{line}\n")));
        } else if line.starts_with("## ") {
            section = Some(line.to_string());
        }
    }
    match open {
        Some((name, _)) => Err(format!(
            "kept block {name:?} has no `{CLOSE}{name} -->` line: close it, or the generator would lose it"
        )),
        None => Ok(kept),
    }
}

/// `new` with every block of `kept` put back at the end of its section; blocks whose section
/// `new` lacks are appended under one heading at the end.
pub(crate) fn restore(new: &str, kept: &[Kept]) -> String {
    let mut out = String::new();
    let mut placed = vec![false; kept.len()];
    let mut section: Option<&str> = None;
    let flush = |out: &mut String, section: Option<&str>, placed: &mut Vec<bool>| {
        for (k, done) in kept.iter().zip(placed.iter_mut()) {
            if !*done && k.section.as_deref() == section {
                if !out.ends_with("\n\n") {
                    out.push('\n');
                }
                out.push_str(&k.text);
                out.push('\n');
                *done = true;
            }
        }
    };
    for line in new.lines() {
        if line.starts_with("## ") {
            flush(&mut out, section, &mut placed);
            section = Some(line);
        }
        out.push_str(line);
        out.push('\n');
    }
    flush(&mut out, section, &mut placed);
    if placed.iter().any(|p| !p) {
        if !out.ends_with("\n\n") {
            out.push('\n');
        }
        out.push_str("## Notes kept from an earlier report\n\n");
        for (k, _) in kept.iter().zip(&placed).filter(|(_, p)| !**p) {
            let was = k.section.as_deref().unwrap_or("(before the first section)");
            out.push_str(&format!(
                "Under `{}` there:\n\n",
                was.trim_start_matches("## ")
            ));
            out.push_str(&k.text);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "# B\n\n## Churn\n\nold table 1\n\n<!-- kept: profile -->\n### Where the time goes\nprofile text\n<!-- end kept: profile -->\n\n## Gone\n\n<!-- kept: lost -->\nabout a bench no longer run\n<!-- end kept: lost -->\n\n## Threads\n\nold table 2\n";

    #[test]
    fn kept_blocks_return_to_their_sections_and_nothing_else_is_copied() {
        let kept = extract(OLD).unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].name, "profile");
        assert_eq!(kept[0].section.as_deref(), Some("## Churn"));
        let new = "# B\n\n## Churn\n\nnew table 1\n\n## Threads\n\nnew table 2\n";
        let out = restore(new, &kept);
        assert!(!out.contains("old table"), "{out}");
        let churn = out.find("new table 1").unwrap();
        let profile = out.find("profile text").unwrap();
        let threads = out.find("## Threads").unwrap();
        assert!(churn < profile && profile < threads, "{out}");
        // The section the new report lacks: kept at the end, saying where it was.
        let tail = out.find("## Notes kept from an earlier report").unwrap();
        assert!(tail > out.find("new table 2").unwrap());
        assert!(out[tail..].contains("Under `Gone` there"), "{out}");
        assert!(out[tail..].contains("about a bench no longer run"));
        // Regenerating again keeps the same blocks, once each.
        let again = restore(new, &extract(&out).unwrap());
        assert_eq!(again.matches("profile text").count(), 1, "{again}");
        assert_eq!(again.matches("about a bench no longer run").count(), 1);
    }

    #[test]
    fn an_unclosed_block_is_an_error_naming_it() {
        let err = extract("## A\n<!-- kept: half -->\ntext\n").unwrap_err();
        assert!(err.contains("\"half\""), "{err}");
        assert!(extract("no markers at all\n").unwrap().is_empty());
    }
}
