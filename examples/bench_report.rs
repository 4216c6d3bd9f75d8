//! Writes BENCHMARKS.md from the last `cargo bench` run: criterion's medians
//! (`<target>/criterion/**/new/estimates.json`, `median.point_estimate`, with the throughput from
//! `benchmark.json`) and the benches' side outputs (`<target>/bench-extra/*.json`: OOMs and peaks,
//! driver calls, skipped parts). Every figure and every "met"/"missed" comes from those files;
//! the text around them (what each bench measures and how to read it) is written here.
//!
//! Usage: `cargo run --release --example bench_report -- [--target DIR] [--out FILE]
//! [--command TEXT]`. `scripts/benchmarks.sh` runs `cargo bench` and then this.
//! `--target` defaults to `$CARGO_TARGET_DIR`, else `target`; `--out` to `BENCHMARKS.md`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use serde_json::Value;

/// Allocators and baselines, in column order; anything else follows in measurement order.
const ORDER: [&str; 6] = [
    "expandable",
    "classic",
    "pytorch-expandable",
    "cudarc-alloc",
    "cuMemAllocAsync",
    "cuMemAlloc",
];
const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// One criterion result.
#[derive(Clone, Copy)]
struct Est {
    /// Median time per iteration, nanoseconds.
    ns: f64,
    /// Elements per iteration (events, operations), when the bench declared a throughput.
    elements: Option<u64>,
    /// When criterion wrote it: measurement order and the section's date.
    when: SystemTime,
}

impl Est {
    /// Elements per second.
    fn rate(&self) -> Option<f64> {
        self.elements.map(|n| n as f64 / (self.ns * 1e-9))
    }
}

/// Everything read from the target directory.
struct Data {
    /// group → (function, case) → result. A bench without a function name (`threads`) has its
    /// parameter as the function and an empty case.
    groups: BTreeMap<String, HashMap<(String, String), Est>>,
    /// Side outputs by bench name.
    extra: BTreeMap<String, Value>,
}

fn main() -> ExitCode {
    let mut target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let mut out = PathBuf::from("BENCHMARKS.md");
    let mut command = String::from("scripts/benchmarks.sh");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or_else(|| format!("{a} needs {what}"));
        let parsed = match a.as_str() {
            "--target" => value("a directory").map(|v| target = v.into()),
            "--out" => value("a file").map(|v| out = v.into()),
            "--command" => value("the command text").map(|v| command = v),
            _ => Err(format!(
                "unknown argument {a:?}; usage: bench_report [--target DIR] [--out FILE] [--command TEXT]"
            )),
        };
        if let Err(e) = parsed {
            eprintln!("bench_report: {e}");
            return ExitCode::from(2);
        }
    }
    let data = match Data::load(&target) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bench_report: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = report(&data, &command, &recorded_machine(&target));
    if let Err(e) = std::fs::write(&out, text) {
        eprintln!("bench_report: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let results: usize = data.groups.values().map(HashMap::len).sum();
    println!(
        "bench_report: wrote {} from {results} results in {}",
        out.display(),
        target.join("criterion").display()
    );
    ExitCode::SUCCESS
}

// ------------------------------------------------------------------------------------------------
// Reading

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl Data {
    fn load(target: &Path) -> Result<Data, String> {
        let criterion = target.join("criterion");
        if !criterion.is_dir() {
            return Err(format!(
                "{} does not exist: run `cargo bench` first (or give --target)",
                criterion.display()
            ));
        }
        let mut data = Data {
            groups: BTreeMap::new(),
            extra: BTreeMap::new(),
        };
        let mut dirs = vec![criterion];
        while let Some(dir) = dirs.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                if path.file_name().is_some_and(|n| n == "new") {
                    data.add(&path)?;
                } else if !path
                    .file_name()
                    .is_some_and(|n| n == "base" || n == "change")
                {
                    dirs.push(path);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(target.join("bench-extra")) {
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                if path.extension().is_some_and(|x| x == "json") {
                    let name = path.file_stem().unwrap_or_default().to_string_lossy();
                    data.extra.insert(name.into_owned(), read_json(&path)?);
                }
            }
        }
        Ok(data)
    }

    /// Adds one `new/` directory (benchmark.json + estimates.json).
    fn add(&mut self, dir: &Path) -> Result<(), String> {
        let (bench, estimates) = (dir.join("benchmark.json"), dir.join("estimates.json"));
        if !bench.is_file() || !estimates.is_file() {
            return Ok(());
        }
        let id = read_json(&bench)?;
        let est = read_json(&estimates)?;
        let text = |k: &str| id[k].as_str().map(str::to_string);
        let group = text("group_id").ok_or_else(|| format!("{}: no group_id", bench.display()))?;
        let (function, case) = match (text("function_id"), text("value_str")) {
            (Some(f), v) => (f, v.unwrap_or_default()),
            (None, Some(v)) => (v, String::new()),
            (None, None) => (String::new(), String::new()),
        };
        let ns = est["median"]["point_estimate"]
            .as_f64()
            .ok_or_else(|| format!("{}: no median.point_estimate", estimates.display()))?;
        let elements = id["throughput"]["Elements"].as_u64();
        let when = std::fs::metadata(&estimates)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.groups
            .entry(group)
            .or_default()
            .insert((function, case), Est { ns, elements, when });
        Ok(())
    }

    fn get(&self, group: &str, function: &str, case: &str) -> Option<Est> {
        self.groups
            .get(group)?
            .get(&(function.to_string(), case.to_string()))
            .copied()
    }

    fn has(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// The group's cases, in the order they were measured.
    fn cases(&self, group: &str) -> Vec<String> {
        let mut first: HashMap<&str, SystemTime> = HashMap::new();
        for ((_, case), e) in self.groups.get(group).into_iter().flatten() {
            let t = first.entry(case).or_insert(e.when);
            *t = (*t).min(e.when);
        }
        let mut cases: Vec<(SystemTime, &str)> = first.into_iter().map(|(c, t)| (t, c)).collect();
        cases.sort();
        cases.into_iter().map(|(_, c)| c.to_string()).collect()
    }

    /// The group's functions: [`ORDER`] first, then the rest in measurement order.
    fn functions(&self, group: &str) -> Vec<String> {
        let mut first: HashMap<&str, SystemTime> = HashMap::new();
        for ((f, _), e) in self.groups.get(group).into_iter().flatten() {
            let t = first.entry(f).or_insert(e.when);
            *t = (*t).min(e.when);
        }
        let rank = |f: &str| ORDER.iter().position(|o| *o == f).unwrap_or(ORDER.len());
        let mut fs: Vec<(usize, SystemTime, &str)> =
            first.into_iter().map(|(f, t)| (rank(f), t, f)).collect();
        fs.sort();
        fs.into_iter().map(|(_, _, f)| f.to_string()).collect()
    }

    /// Groups whose name starts with `prefix`, in name order.
    fn groups_with(&self, prefix: &str) -> Vec<String> {
        self.groups
            .keys()
            .filter(|g| g.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The date of the newest result among `groups`.
    fn date(&self, groups: &[String]) -> String {
        groups
            .iter()
            .filter_map(|g| self.groups.get(g))
            .flat_map(|m| m.values().map(|e| e.when))
            .max()
            .map(date)
            .unwrap_or_else(|| "never (no results)".into())
    }

    fn extra(&self, name: &str) -> Option<&Value> {
        self.extra.get(name)
    }
}

// ------------------------------------------------------------------------------------------------
// Formatting

/// `YYYY-MM-DD` (UTC) of a time.
fn date(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Howard Hinnant's civil_from_days.
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Three significant digits at most.
fn sig3(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn time(ns: f64) -> String {
    if ns < 1e3 {
        format!("{} ns", sig3(ns))
    } else if ns < 1e6 {
        format!("{} µs", sig3(ns / 1e3))
    } else if ns < 1e9 {
        format!("{} ms", sig3(ns / 1e6))
    } else {
        format!("{} s", sig3(ns / 1e9))
    }
}

fn ratio(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.1}")
    } else if r >= 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.3}")
    }
}

/// A rate in millions (or thousands) per second.
fn rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2} M", per_s / 1e6)
    } else {
        format!("{:.1} k", per_s / 1e3)
    }
}

/// An integer with thousands separators.
fn int(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", int((bytes as f64 / MIB).round() as u64))
}

/// `lo–hi` of some values, formatted, or `lo` when equal.
fn range(values: &[f64], f: fn(f64) -> String) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (f(lo), f(hi));
    if a == b {
        a
    } else {
        format!("{a}–{b}")
    }
}

fn row(out: &mut String, cells: &[String]) {
    writeln!(out, "| {} |", cells.join(" | ")).expect("write to a String");
}

fn header(out: &mut String, cells: &[String]) {
    row(out, cells);
    row(out, &vec!["---".to_string(); cells.len()]);
}

// ------------------------------------------------------------------------------------------------
// Tables

/// A target's verdict, listed at the top of the report.
struct Verdict {
    target: String,
    measured: String,
    met: Option<bool>,
}

impl Verdict {
    fn status(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "not measured",
        }
    }
}

/// One row per case, one column per function: each other function's median over `base`'s
/// (ratios first), then the medians, then the rates when the bench declared a throughput.
fn allocator_table(
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

/// The hot-path targets: expandable at most 100 ns in every case and never slower than classic.
fn hot_path_verdicts(d: &Data, group: &str, label: &str) -> Vec<Verdict> {
    let mut times = Vec::new();
    let mut over = 0;
    let mut slower = 0;
    let mut vs_classic = Vec::new();
    let cases = d.cases(group);
    for case in &cases {
        let Some(e) = d.get(group, "expandable", case) else {
            continue;
        };
        times.push(e.ns);
        if e.ns > 100.0 {
            over += 1;
        }
        if let Some(c) = d.get(group, "classic", case) {
            vs_classic.push(c.ns / e.ns);
            if e.ns > c.ns {
                slower += 1;
            }
        }
    }
    let n = times.len();
    if n == 0 {
        return vec![
            Verdict {
                target: format!("{label}: expandable ≤ 100 ns at every size and live count"),
                measured: "no results".into(),
                met: None,
            },
            Verdict {
                target: format!("{label}: expandable never slower than classic"),
                measured: "no results".into(),
                met: None,
            },
        ];
    }
    vec![
        Verdict {
            target: format!("{label}: expandable ≤ 100 ns at every size and live count"),
            measured: format!("{} ({over} of {n} cases over 100 ns)", range(&times, time)),
            met: Some(over == 0),
        },
        Verdict {
            target: format!("{label}: expandable never slower than classic"),
            measured: if vs_classic.is_empty() {
                "no classic results".into()
            } else {
                format!(
                    "slower in {slower} of {} cases (classic / expandable {})",
                    vs_classic.len(),
                    range(&vs_classic, ratio)
                )
            },
            met: (!vs_classic.is_empty()).then_some(slower == 0),
        },
    ]
}

/// The growth tables of `prefix/<N>GiB` groups: per target, the raw loops and every allocator's
/// phases, ratios against both raw loops, medians, and the creations/maps/access calls of the
/// phase from `counts` (the side output's `targets`).
fn growth_table(out: &mut String, d: &Data, prefix: &str, counts: Option<&Value>) {
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

/// The growth targets: zero creations on warm regrowth (from the side output) and, when
/// `within` is given, expandable's growth within that factor of the raw loop with the same pages.
fn growth_verdicts(
    d: &Data,
    prefix: &str,
    counts: Option<&Value>,
    label: &str,
    within: Option<f64>,
) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    let targets = counts
        .and_then(|c| c.get("targets"))
        .and_then(Value::as_array);
    let mut creates = Vec::new();
    for t in targets.into_iter().flatten() {
        let gib = t["target_bytes"].as_f64().unwrap_or(0.0) / GIB;
        let n = t["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["case"] == "expandable-warm-cache" && r["phase"] == "regrow");
        if let Some(n) = n.and_then(|r| r["calls"]["cuMemCreate"].as_u64()) {
            creates.push((gib, n));
        }
    }
    verdicts.push(Verdict {
        target: format!("{label}: regrowth with a warm handle cache creates no handle"),
        measured: if creates.is_empty() {
            "no call counts".into()
        } else {
            creates
                .iter()
                .map(|(g, n)| format!("{n} cuMemCreate at {g} GiB"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        met: (!creates.is_empty()).then(|| creates.iter().all(|&(_, n)| n == 0)),
    });
    if let Some(limit) = within {
        let mut ratios = Vec::new();
        for group in d.groups_with(&format!("{prefix}/")) {
            let target = group
                .rsplit('/')
                .next()
                .unwrap_or("")
                .replace("GiB", " GiB");
            if let (Some(e), Some(r)) = (
                d.get(&group, "expandable", "grow"),
                d.get(&group, "raw-20MiB", ""),
            ) {
                ratios.push((target, e.ns / r.ns));
            }
        }
        verdicts.push(Verdict {
            target: format!(
                "{label}: expandable's growth within {limit}× of the raw loop (same pages)"
            ),
            measured: if ratios.is_empty() {
                "no results".into()
            } else {
                ratios
                    .iter()
                    .map(|(t, r)| format!("{}× at {t}", ratio(*r)))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            met: (!ratios.is_empty()).then(|| ratios.iter().all(|(_, r)| *r <= limit)),
        });
    }
    verdicts
}

/// What each allocator needed per case (OOMs, peak reserved), from a side output's `runs`.
fn needed_table(out: &mut String, runs: &[Value], funcs: &[String]) {
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
fn churn_summary(d: &Data, group: &str) -> Option<String> {
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

// ------------------------------------------------------------------------------------------------
// The report

/// The machine the benches ran on: recorded in `<target>/bench-extra/machine.txt` by the first
/// report after a run (`scripts/benchmarks.sh` clears `bench-extra/` before benchmarking), so a
/// later `--report-only` elsewhere still names the machine that measured.
fn recorded_machine(target: &Path) -> String {
    let dir = target.join("bench-extra");
    let path = dir.join("machine.txt");
    if let Ok(text) = std::fs::read_to_string(&path) {
        return text.trim().to_string();
    }
    let line = machine();
    let saved =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, format!("{line}\n")));
    if let Err(e) = saved {
        eprintln!(
            "bench_report: note: could not record {}: {e}",
            path.display()
        );
    }
    line
}

/// CPU model, cores and memory of this machine, from /proc.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!(", {:.0} GiB memory", kib / (1u64 << 20) as f64))
        })
        .unwrap_or_default();
    format!("{model}, {cores} cores{mem}")
}

/// The GPU line: the device the GPU bench ran on, or why it was skipped.
fn gpu_line(d: &Data) -> String {
    match d.extra("gpu") {
        None => "not known (the GPU bench has not run)".into(),
        Some(g) => match g["skipped"].as_str() {
            Some(why) => format!("none (GPU benches skipped: {why})"),
            None => format!(
                "{}, {:.1} GiB",
                g["device"].as_str().unwrap_or("unknown"),
                g["total_bytes"].as_f64().unwrap_or(0.0) / GIB
            ),
        },
    }
}

fn section_head(out: &mut String, d: &Data, title: &str, bench: &str, groups: &[String]) {
    writeln!(out, "## {title}\n").expect("write to a String");
    writeln!(
        out,
        "`cargo bench --bench {bench}` ([benches/{bench}.rs](benches/{bench}.rs)), measured {}.",
        d.date(groups)
    )
    .expect("write to a String");
}

fn not_run(out: &mut String, group: &str) {
    writeln!(
        out,
        "_No results: `<target>/criterion/{group}` is missing (the bench has not run, or ran \
         with a filter that left it out)._\n"
    )
    .expect("write to a String");
}

fn report(d: &Data, command: &str, machine: &str) -> String {
    let mut body = String::new();
    let mut verdicts = Vec::new();
    let out = &mut body;

    // Hot path.
    section_head(
        out,
        d,
        "Hot path: cached allocate + deallocate pair",
        "hot_path",
        &["hot_path".into()],
    );
    out.push_str(
        "Sim backend, 1 TiB. The \"live\" allocations are fragmented (twice as many allocated, \
every other one freed, sizes cycling 512 B / 4 KiB / 64 KiB / 768 KiB), so the free-range index \
holds about as many ranges. Each size is allocated and freed once untimed first, so the timed \
pair finds its memory cached. 20 samples, 2 s.\n\n",
    );
    if d.has("hot_path") {
        allocator_table(out, d, "hot_path", "case (size/live)", "expandable", "");
        driver_notes(out, d.extra("hot_path"));
    } else {
        not_run(out, "hot_path");
    }
    let hot = hot_path_verdicts(d, "hot_path", "Hot path (Sim)");
    write_verdicts(out, &hot);
    verdicts.extend(hot);

    // Churn.
    section_head(
        out,
        d,
        "Churn: RMM's `random_allocations` shape",
        "churn",
        &["churn".into()],
    );
    out.push_str(
        "`workloads::rmm_random(1, max, ops)` (73 % allocations, sizes uniform in [1 B, max]) \
replayed with `trace::replay::replay` on a fresh 16 GiB Sim per run: the time includes building \
and dropping the allocator. 10 samples, 2 s. Time per run:\n\n",
    );
    if d.has("churn") {
        allocator_table(out, d, "churn", "case", "expandable", "");
        if let Some(s) = churn_summary(d, "churn") {
            writeln!(out, "{s}\n").expect("write to a String");
        }
        if let Some(runs) = d.extra("churn").and_then(|c| c["runs"].as_array()) {
            out.push_str(
                "What each needed (deterministic: one untimed run per case; once max reaches 64 \
MiB the 16 GiB device is full, so time goes to the pressure path on the way to an OOM, and fewer \
OOMs means more of the requests were served):\n\n",
            );
            needed_table(out, runs, &d.functions("churn"));
        }
    } else {
        not_run(out, "churn");
    }

    // Replay.
    section_head(out, d, "Replay throughput", "replay", &["replay".into()]);
    out.push_str(
        "`trace::replay::replay` on the default 80 GiB Sim (fresh per run). Traces: the built-in \
`transformer_training(1)` and the largest file in `../shared/traces/pytorch` (initial blocks \
included). A run's time includes building the Sim and the allocator and, for a warm-start trace, \
its initial blocks, so a short trace pays that fixed cost over fewer events. Events/s is the \
trace's events over the median run time. 10 samples, 3 s.\n\n",
    );
    if let Some(why) = d
        .extra("replay")
        .and_then(|r| r["shared_trace_skipped"].as_str())
    {
        writeln!(out, "The shared trace was **skipped**: {why}.\n").expect("write to a String");
    }
    if d.has("replay") {
        allocator_table(out, d, "replay", "trace", "expandable", "events/s");
    } else {
        not_run(out, "replay");
    }
    let rates: Vec<(String, f64)> = d
        .cases("replay")
        .into_iter()
        .filter_map(|c| Some((c.clone(), d.get("replay", "expandable", &c)?.rate()?)))
        .collect();
    let replay_verdict = Verdict {
        target: "Replay (Sim): expandable ≥ 5 M events/s on every trace".into(),
        measured: if rates.is_empty() {
            "no results".into()
        } else {
            rates
                .iter()
                .map(|(c, r)| format!("{} events/s on `{c}`", rate(*r)))
                .collect::<Vec<_>>()
                .join(", ")
        },
        met: (!rates.is_empty()).then(|| rates.iter().all(|(_, r)| *r >= 5e6)),
    };
    write_verdicts(out, std::slice::from_ref(&replay_verdict));
    verdicts.push(replay_verdict);

    // Growth on Host.
    let growth_groups = d.groups_with("growth/");
    section_head(
        out,
        d,
        "Growth and release on Host",
        "growth",
        &growth_groups,
    );
    out.push_str(
        "Host backend: real `mmap`/`mprotect` mappings of a sparse memfd, 2 MiB granularity, \
16 GiB capacity; pages are mapped but never written, so 8 GiB costs VMAs, not RAM. Growth is \
64 MiB allocations until the target is allocated; release is deallocate everything + \
`empty_cache`; `expandable-warm-cache` is expandable with `handle_cache_limit` = 16 GiB, \
regrowing after a release that kept the handles. The floor is the raw backend loop with no \
allocator: create + map + set_access per page, with 2 MiB pages and with the 20 MiB pages both \
expandable policies use for large blocks (1 GiB is 52 of them, 8 GiB 410). Flat sampling, \
10 samples, 2 s. Ratios are against `raw-20MiB`, the loop with the same page count, and \
`raw-2MiB`; the call counts are those of the phase (for the raw loops, of the page loop).\n\n",
    );
    if growth_groups.is_empty() {
        not_run(out, "growth_<N>GiB");
    } else {
        growth_table(out, d, "growth", d.extra("growth"));
    }
    out.push_str(
        "Each expandable growth also makes one `cuMemAddressReserve`; each release one \
`cuMemAddressFree` and one `cuStreamSynchronize`, with one `cuMemUnmap` per page and one \
`cuMemRelease` per page except with the warm cache, which releases none. Classic makes one \
reserve + create + map + access per 64 MiB request (its own segment) and frees each on release. \
Expandable sets access once per allocation rather than once per page, which is how it can beat \
the raw loop. On Host a `cuMemCreate` only hands out a range of the memfd, so the warm cache \
saves little time here; the creations it avoids matter on a GPU (about 190 µs each on an A100, \
issue 7's anchor; see the GPU section).\n\n",
    );
    let growth = growth_verdicts(d, "growth", d.extra("growth"), "Growth (Host)", Some(1.5));
    write_verdicts(out, &growth);
    verdicts.extend(growth);

    // Threads.
    let thread_groups = d.groups_with("threads/");
    section_head(
        out,
        d,
        "Threads: one shared allocator, separate streams",
        "threads",
        &thread_groups,
    );
    out.push_str(
        "Sim. Each thread has its own stream and keeps a ring of 8 live blocks; per step it frees \
the oldest and allocates the next of 512 B / 4 KiB / 64 KiB / 1 MiB / 3 MiB / 20 MiB, 2,000 \
steps per thread per iteration, on memory mapped before timing. One operation is one `allocate` \
or one `deallocate`; ops/s counts all threads together. The time runs from a common start \
barrier to the last thread's end. 20 samples, 2 s.\n\n",
    );
    if thread_groups.is_empty() {
        not_run(out, "threads_<N>");
    } else {
        threads_table(out, d, &thread_groups);
    }

    buffer_section(out, d, &mut verdicts);

    // GPU.
    gpu_section(out, d, &mut verdicts);

    // Assemble: header, targets, sections.
    let mut all: Vec<String> = d.groups.keys().cloned().collect();
    all.sort();
    let mut doc = String::new();
    let w = &mut doc;
    w.push_str("# Benchmarks\n\n");
    writeln!(
        w,
        "<!-- Generated by examples/bench_report.rs from target/criterion and target/bench-extra: \
edit the generator, not this file. -->\n"
    )
    .expect("write to a String");
    writeln!(
        w,
        "**Regenerate:** `{command}` (runs `cargo bench`, then `cargo run --release --example \
bench_report`, which writes this file). `scripts/benchmarks.sh --report-only` rewrites it from \
the last run's results without benchmarking.\n"
    )
    .expect("write to a String");
    writeln!(w, "**Machine:** {machine}. **GPU:** {}.", gpu_line(d)).expect("write to a String");
    writeln!(
        w,
        "**Date:** measured {} (newest result; each section gives its own), report written {}.\n",
        d.date(&all),
        date(SystemTime::now())
    )
    .expect("write to a String");
    w.push_str(
        "Criterion benchmarks under `benches/` (issue 7). Every bench runs all allocators in the \
same process, so the **ratios** (first columns) hold on a noisy machine; absolute medians follow. \
A ratio is that case's median time over the named allocator's (usually `expandable`): below 1 \
means faster than it. Medians are criterion's `median.point_estimate` in \
`target/criterion/<group>/<allocator>/<case>/new/estimates.json`; OOM counts, peaks, driver call \
counts and skips come from the benches' side outputs in `target/bench-extra/`. One bench alone: \
`cargo bench --bench <name>`, then `scripts/benchmarks.sh --report-only`.\n\n",
    );
    w.push_str("## Targets\n\n");
    header(w, &["target", "measured", "status"].map(String::from));
    for v in &verdicts {
        row(
            w,
            &[
                v.target.clone(),
                v.measured.clone(),
                format!("**{}**", v.status()),
            ],
        );
    }
    w.push('\n');
    w.push_str(&body);
    doc
}

/// Whether a timed hot-path pair reached the driver, from a side output's
/// `driver_calls_while_timed`.
fn driver_notes(out: &mut String, hot: Option<&Value>) {
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

fn write_verdicts(out: &mut String, verdicts: &[Verdict]) {
    for v in verdicts {
        writeln!(
            out,
            "**Target {}:** {} — {}.\n",
            v.status(),
            v.target,
            v.measured
        )
        .expect("write to a String");
    }
}

/// One row per thread count: time ratios against expandable, then ops/s, then expandable's time
/// per operation; and the scaling from the fewest to the most threads.
fn threads_table(out: &mut String, d: &Data, groups: &[String]) {
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
                .filter_map(|f| {
                    let a = d.get(first, f, "")?.rate()?;
                    let b = d.get(last, f, "")?.rate()?;
                    Some(format!("{f} {}×", ratio(b / a)))
                })
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

fn gpu_section(out: &mut String, d: &Data, verdicts: &mut Vec<Verdict>) {
    let mut groups = vec![
        "gpu_hot_path".to_string(),
        "gpu_churn".into(),
        "gpu_replay".into(),
    ];
    groups.extend(d.groups_with("gpu_growth/"));
    section_head(
        out,
        d,
        "On a GPU: the Cuda backend and the driver's own allocators",
        "gpu",
        &groups,
    );
    out.push_str(
        "Benchmarks 1–4 on the Cuda backend (device 0), against what a Rust user would otherwise \
call, and the raw driver loop as the physical floor for growth:\n\n\
* `gpu_hot_path`: the hot-path pair above (same sizes and background, live 0 and 1,000) for the \
three allocators, and the baselines at the same sizes: `cudarc-alloc` (`CudaStream::alloc` + \
drop on the default stream: `cuMemAllocAsync` + `cuMemFreeAsync`, plus cudarc's two events per \
slice), `cuMemAllocAsync` (the same driver calls without cudarc) and `cuMemAlloc` \
(`cuMemAlloc` + `cuMemFree`). Stream-ordered pairs are timed per batch, with the stream \
synchronized after it, untimed.\n\
* `gpu_growth`: the Host growth cases above on Cuda, the raw loop being `cuMemCreate` + \
`cuMemMap` + `cuMemSetAccess` per page through the backend.\n\
* `gpu_churn`: the churn shape, 10,000 operations, on a 16 GiB budget \
(`per_process_memory_fraction`), a fresh allocator per run.\n\
* `gpu_replay`: the replay traces on the whole device. Sim's replay engine cannot drive a \
device, so the bench replays with the same loop (OOMs counted and skipped, `held_bytes()` read after \
every event), each trace stream a registered cudarc stream.\n\n",
    );
    let gpu = d.extra("gpu");
    if let Some(why) = gpu.and_then(|g| g["skipped"].as_str()) {
        writeln!(
            out,
            "**Skipped:** {why}. Run `scripts/benchmarks.sh` (or `cargo bench --bench gpu`, then \
`scripts/benchmarks.sh --report-only`) on a machine with an NVIDIA driver and GPU.\n"
        )
        .expect("write to a String");
        return;
    }
    if gpu.is_none() && !d.has("gpu_hot_path") {
        not_run(out, "gpu_hot_path");
        return;
    }
    if let Some(g) = gpu {
        writeln!(out, "Device: {}.\n", gpu_line(d)).expect("write to a String");
        for why in g["growth"]["skipped"].as_array().into_iter().flatten() {
            writeln!(out, "Skipped: {}.\n", why.as_str().unwrap_or("?"))
                .expect("write to a String");
        }
    }
    out.push_str("### Hot path and the baselines\n\n");
    if d.has("gpu_hot_path") {
        allocator_table(out, d, "gpu_hot_path", "case (size/live)", "expandable", "");
        driver_notes(out, gpu.map(|g| &g["hot_path"]));
    } else {
        not_run(out, "gpu_hot_path");
    }
    let hot = hot_path_verdicts(d, "gpu_hot_path", "Hot path (Cuda)");
    write_verdicts(out, &hot);
    verdicts.extend(hot);

    out.push_str("### Growth and release\n\n");
    let counts = gpu.map(|g| &g["growth"]);
    if d.groups_with("gpu_growth/").is_empty() {
        not_run(out, "gpu_growth_<N>GiB");
    } else {
        growth_table(out, d, "gpu_growth", counts);
    }
    let growth = growth_verdicts(d, "gpu_growth", counts, "Growth (Cuda)", None);
    write_verdicts(out, &growth);
    verdicts.extend(growth);

    out.push_str("### Churn\n\n");
    if let Some(cap) = gpu.and_then(|g| g["churn"]["capacity_bytes"].as_f64()) {
        writeln!(out, "Budget: {:.1} GiB of the device.\n", cap / GIB).expect("write to a String");
    }
    if d.has("gpu_churn") {
        allocator_table(out, d, "gpu_churn", "case", "expandable", "");
        if let Some(s) = churn_summary(d, "gpu_churn") {
            writeln!(out, "{s}\n").expect("write to a String");
        }
        if let Some(runs) = gpu.and_then(|g| g["churn"]["runs"].as_array()) {
            needed_table(out, runs, &d.functions("gpu_churn"));
        }
    } else {
        not_run(out, "gpu_churn");
    }

    out.push_str("### Replay throughput\n\n");
    if let Some(why) = gpu.and_then(|g| g["replay"]["shared_trace_skipped"].as_str()) {
        writeln!(out, "The shared trace was **skipped**: {why}.\n").expect("write to a String");
    }
    if d.has("gpu_replay") {
        allocator_table(out, d, "gpu_replay", "trace", "expandable", "events/s");
        if let Some(runs) = gpu.and_then(|g| g["replay"]["runs"].as_array()) {
            needed_table(out, runs, &d.functions("gpu_replay"));
        }
    } else {
        not_run(out, "gpu_replay");
    }
}

/// The buffer wrapper's cost: `Buffer` allocate + drop against the bare pair (benches/buffer.rs).
fn buffer_section(out: &mut String, d: &Data, verdicts: &mut Vec<Verdict>) {
    const GROUP: &str = "buffer_pair";
    let groups = [GROUP.to_string()];
    section_head(out, d, "Buffer wrapper: allocate + drop", "buffer", &groups);
    out.push_str(
        "Sim, warm (the block is cached). `Buffer::new` + drop (what `DeviceBuffer<T>` is built \
on) against `allocate` + `deallocate` of the same allocator, in one process. Target (issue 17): \
at most 10 ns more.\n\n",
    );
    if !d.has(GROUP) {
        not_run(out, GROUP);
        verdicts.push(Verdict {
            target: "Buffer (Sim): allocate + drop ≤ 10 ns more than the bare pair".into(),
            measured: "not run".into(),
            met: None,
        });
        return;
    }
    header(
        out,
        &[
            "allocator",
            "size",
            "bare pair",
            "buffer pair",
            "difference",
        ]
        .map(String::from),
    );
    let mut worst: Option<f64> = None;
    for alloc in ["expandable", "classic"] {
        for size in d.cases(GROUP) {
            let bare = d.get(GROUP, &format!("{alloc}/allocation"), &size);
            let buf = d.get(GROUP, &format!("{alloc}/buffer"), &size);
            if let (Some(bare), Some(buf)) = (bare, buf) {
                let diff = buf.ns - bare.ns;
                worst = Some(worst.map_or(diff, |w: f64| w.max(diff)));
                row(
                    out,
                    &[
                        alloc.into(),
                        size.clone(),
                        time(bare.ns),
                        time(buf.ns),
                        format!("{diff:+.1} ns"),
                    ],
                );
            }
        }
    }
    out.push('\n');
    verdicts.push(Verdict {
        target: "Buffer (Sim): allocate + drop ≤ 10 ns more than the bare pair".into(),
        measured: worst.map_or("no pairs".into(), |w| format!("at most {w:+.1} ns")),
        met: worst.map(|w| w <= 10.0),
    });
}
