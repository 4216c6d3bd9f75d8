//! The tables of the report: allocators side by side, growth, what each run needed, churn,
//! threads, and whether timed pairs reached the driver.

use super::*;

/// One row per case, one column per function: each other function's median over `base`'s
/// (ratios first), then the medians, then the rates when the bench declared a throughput.
pub(crate) fn allocator_table(
    out: &mut String,
    d: &Data,
    group: &str,
    case_header: &str,
    base: &str,
    rate_unit: &str,
) {
    let funcs = d.functions(group);
    let others: Vec<&String> = funcs.iter().filter(|f| *f != base).collect();
    let cases = d.cases(group);
    let has_rate = cases
        .iter()
        .any(|c| d.get(group, base, c).and_then(|e| e.rate()).is_some());
    let mut cols = vec![case_header.to_string()];
    cols.extend(others.iter().map(|f| format!("{f} / {base}")));
    cols.extend(funcs.iter().map(|f| format!("{f} median")));
    if has_rate {
        cols.extend(funcs.iter().map(|f| format!("{f} {rate_unit}")));
    }
    header(out, &cols);
    for case in &cases {
        let mut cells = vec![format!("`{case}`")];
        let b = d.get(group, base, case);
        for f in &others {
            cells.push(match (d.get(group, f, case), b) {
                (Some(e), Some(b)) => ratio(e.ns / b.ns),
                _ => String::new(),
            });
        }
        for f in &funcs {
            cells.push(
                d.get(group, f, case)
                    .map(|e| time(e.ns))
                    .unwrap_or_default(),
            );
        }
        if has_rate {
            for f in &funcs {
                let r = d.get(group, f, case).and_then(|e| e.rate());
                cells.push(r.map(rate).unwrap_or_default());
            }
        }
        row(out, &cells);
    }
    out.push('\n');
}

/// The growth tables of `prefix/<N>GiB` groups: per target, the raw loops and every allocator's
/// phases, ratios against both raw loops, medians, and the creations/maps/access calls of the
/// phase from `counts` (the side output's `targets`).
pub(crate) fn growth_table(out: &mut String, d: &Data, prefix: &str, counts: Option<&Value>) {
    let cols = [
        "target",
        "case",
        "/ raw-20MiB",
        "/ raw-2MiB",
        "median",
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
    ];
    header(out, &cols.map(String::from));
    for group in d.groups_with(&format!("{prefix}/")) {
        let target = group
            .rsplit('/')
            .next()
            .unwrap_or("")
            .replace("GiB", " GiB");
        let bytes = target
            .trim_end_matches(" GiB")
            .parse::<f64>()
            .map(|g| (g * GIB) as u64)
            .ok();
        let raw20 = d.get(&group, "raw-20MiB", "");
        let raw2 = d.get(&group, "raw-2MiB", "");
        let calls = |case: &str, phase: &str| -> Option<[u64; 3]> {
            let targets = counts?.get("targets")?.as_array()?;
            let t = targets
                .iter()
                .find(|t| t["target_bytes"].as_u64() == bytes)?;
            let r = t["rows"]
                .as_array()?
                .iter()
                .find(|r| r["case"] == case && r["phase"] == phase)?;
            let c = &r["calls"];
            Some([
                c["cuMemCreate"].as_u64()?,
                c["cuMemMap"].as_u64()?,
                c["cuMemSetAccess"].as_u64()?,
            ])
        };
        let mut cases: Vec<(String, String)> = Vec::new();
        for raw in ["raw-2MiB", "raw-20MiB"] {
            cases.push((raw.into(), String::new()));
        }
        for f in d.functions(&group) {
            if f.starts_with("raw-") {
                continue;
            }
            for phase in ["grow", "regrow"] {
                if d.get(&group, &f, phase).is_some() {
                    cases.push((f.clone(), phase.into()));
                }
            }
        }
        for f in d.functions(&group) {
            if d.get(&group, &f, "release").is_some() {
                cases.push((f, "release".into()));
            }
        }
        for (f, phase) in cases {
            let Some(e) = d.get(&group, &f, &phase) else {
                continue;
            };
            let name = if phase.is_empty() {
                f.clone()
            } else {
                format!("{f}/{phase}")
            };
            let vs = |raw: Option<Est>| raw.map(|r| ratio(e.ns / r.ns)).unwrap_or_default();
            let n = match phase.as_str() {
                "" => calls(&f, "cycle"),
                "release" => None,
                p => calls(&f, p),
            };
            let mut cells = vec![target.clone(), format!("`{name}`"), vs(raw20)];
            cells.push(if phase == "release" {
                String::new()
            } else {
                vs(raw2)
            });
            cells.push(time(e.ns));
            match n {
                Some(n) => cells.extend(n.map(int)),
                None => cells.extend([String::new(), String::new(), String::new()]),
            }
            row(out, &cells);
        }
    }
    out.push('\n');
}

/// What each allocator needed per case (OOMs, peak reserved), from a side output's `runs`.
pub(crate) fn needed_table(out: &mut String, runs: &[Value], funcs: &[String]) {
    let mut cases: Vec<String> = Vec::new();
    for r in runs {
        if let Some(c) = r["case"].as_str() {
            if !cases.iter().any(|x| x == c) {
                cases.push(c.to_string());
            }
        }
    }
    let find = |f: &str, c: &str| runs.iter().find(|r| r["allocator"] == f && r["case"] == c);
    let mut cols = vec!["case".to_string()];
    cols.extend(funcs.iter().map(|f| format!("{f} OOMs")));
    cols.extend(funcs.iter().map(|f| format!("{f} peak reserved")));
    cols.push("peak live".into());
    header(out, &cols);
    for c in &cases {
        let mut cells = vec![format!("`{c}`")];
        for f in funcs {
            let n = find(f, c).and_then(|r| r["ooms"].as_u64());
            cells.push(n.map(int).unwrap_or_default());
        }
        for f in funcs {
            let n = find(f, c).and_then(|r| r["peak_reserved_bytes"].as_u64());
            cells.push(n.map(mib).unwrap_or_default());
        }
        let live: Vec<f64> = funcs
            .iter()
            .filter_map(|f| find(f, c)?["peak_live_bytes"].as_f64())
            .collect();
        cells.push(if live.is_empty() {
            String::new()
        } else {
            let whole = |b: f64| int((b / MIB).round() as u64);
            format!("{} MiB", range(&live, whole))
        });
        row(out, &cells);
    }
    out.push('\n');
}

/// Expandable's time over classic's, per churn case, as a range per max size.
pub(crate) fn churn_summary(d: &Data, group: &str) -> Option<String> {
    let mut by_max: Vec<(String, Vec<f64>)> = Vec::new();
    for case in d.cases(group) {
        let (Some(e), Some(c)) = (
            d.get(group, "expandable", &case),
            d.get(group, "classic", &case),
        ) else {
            continue;
        };
        let max = case.split('/').next().unwrap_or("").to_string();
        match by_max.iter_mut().find(|(m, _)| *m == max) {
            Some((_, v)) => v.push(e.ns / c.ns),
            None => by_max.push((max, vec![e.ns / c.ns])),
        }
    }
    if by_max.is_empty() {
        return None;
    }
    let parts: Vec<String> = by_max
        .iter()
        .map(|(m, v)| format!("{}× at {m}", range(v, ratio)))
        .collect();
    Some(format!(
        "Expandable's time over classic's: {}.",
        parts.join(", ")
    ))
}

/// Whether a timed hot-path pair reached the driver, from a side output's
/// `driver_calls_while_timed`.
pub(crate) fn driver_notes(out: &mut String, hot: Option<&Value>) {
    match hot.and_then(|h| h["driver_calls_while_timed"].as_array()) {
        Some(notes) if notes.is_empty() => out.push_str(
            "No timed pair of the expandable policies made a driver call (the check reads \
`stats().calls`, which only the expandable policies fill).\n\n",
        ),
        Some(notes) => {
            let list: Vec<String> = notes
                .iter()
                .map(|n| {
                    format!(
                        "{} `{}` ({} calls)",
                        n["allocator"].as_str().unwrap_or("?"),
                        n["case"].as_str().unwrap_or("?"),
                        n["driver_calls"]
                    )
                })
                .collect();
            writeln!(
                out,
                "**Timed pairs that reached the driver** (not purely cached): {}.\n",
                list.join(", ")
            )
            .expect("write to a String");
        }
        None => {}
    }
}

/// Total throughput of `func` in group `to` over that in group `from` (e.g. 2 threads over 1).
pub(crate) fn scaling(d: &Data, from: &str, to: &str, func: &str) -> Option<f64> {
    Some(d.get(to, func, "")?.rate()? / d.get(from, func, "")?.rate()?)
}

/// One row per thread count: time ratios against expandable, then ops/s, then expandable's time
/// per operation; and the scaling from the fewest to the most threads.
pub(crate) fn threads_table(out: &mut String, d: &Data, groups: &[String]) {
    let funcs = d.functions(&groups[0]);
    let mut cols = vec!["threads".to_string()];
    cols.extend(
        funcs
            .iter()
            .filter(|f| *f != "expandable")
            .map(|f| format!("{f} / expandable")),
    );
    cols.extend(funcs.iter().map(|f| format!("{f} ops/s")));
    cols.push("expandable ns/op".into());
    header(out, &cols);
    let mut groups = groups.to_vec();
    groups.sort_by_key(|g| g.rsplit('/').next().and_then(|n| n.parse::<u32>().ok()));
    for g in &groups {
        let n = g.rsplit('/').next().unwrap_or("");
        let base = d.get(g, "expandable", "");
        let mut cells = vec![n.to_string()];
        for f in funcs.iter().filter(|f| *f != "expandable") {
            cells.push(match (d.get(g, f, ""), base) {
                (Some(e), Some(b)) => ratio(e.ns / b.ns),
                _ => String::new(),
            });
        }
        for f in &funcs {
            let r = d.get(g, f, "").and_then(|e| e.rate());
            cells.push(r.map(|r| format!("{} ops/s", rate(r))).unwrap_or_default());
        }
        let per_op = base.and_then(|b| Some(b.ns / b.elements? as f64));
        cells.push(per_op.map(|p| format!("{p:.0}")).unwrap_or_default());
        row(out, &cells);
    }
    out.push('\n');
    if let (Some(first), Some(last)) = (groups.first(), groups.last()) {
        if first != last {
            let parts: Vec<String> = funcs
                .iter()
                .filter_map(|f| Some(format!("{f} {}×", ratio(scaling(d, first, last, f)?))))
                .collect();
            let (a, b) = (
                first.rsplit('/').next().unwrap_or(""),
                last.rsplit('/').next().unwrap_or(""),
            );
            writeln!(
                out,
                "Scaling from {a} to {b} threads (total ops/s, {b} threads over {a}): {}.\n",
                parts.join(", ")
            )
            .expect("write to a String");
        }
    }
}
