//! Reading the last run: criterion's medians and throughputs, the benches' side outputs, and
//! the machine they ran on.

use super::*;

/// One criterion result.
#[derive(Clone, Copy)]
pub(crate) struct Est {
    /// Median time per iteration, nanoseconds.
    pub(crate) ns: f64,
    /// Elements per iteration (events, operations), when the bench declared a throughput.
    pub(crate) elements: Option<u64>,
    /// When criterion wrote it: measurement order and the section's date.
    pub(crate) when: SystemTime,
}

impl Est {
    /// Elements per second.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.elements.map(|n| n as f64 / (self.ns * 1e-9))
    }
}

/// Everything read from the target directory.
pub(crate) struct Data {
    /// group → (function, case) → result. A bench without a function name (`threads`) has its
    /// parameter as the function and an empty case.
    pub(crate) groups: BTreeMap<String, HashMap<(String, String), Est>>,
    /// Side outputs by bench name.
    pub(crate) extra: BTreeMap<String, Value>,
}

pub(crate) fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl Data {
    pub(crate) fn load(target: &Path) -> Result<Data, String> {
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
    pub(crate) fn add(&mut self, dir: &Path) -> Result<(), String> {
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

    pub(crate) fn get(&self, group: &str, function: &str, case: &str) -> Option<Est> {
        self.groups
            .get(group)?
            .get(&(function.to_string(), case.to_string()))
            .copied()
    }

    pub(crate) fn has(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// The group's cases, in the order they were measured.
    pub(crate) fn cases(&self, group: &str) -> Vec<String> {
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
    pub(crate) fn functions(&self, group: &str) -> Vec<String> {
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
    pub(crate) fn groups_with(&self, prefix: &str) -> Vec<String> {
        self.groups
            .keys()
            .filter(|g| g.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The date of the newest result among `groups`.
    pub(crate) fn date(&self, groups: &[String]) -> String {
        groups
            .iter()
            .filter_map(|g| self.groups.get(g))
            .flat_map(|m| m.values().map(|e| e.when))
            .max()
            .map(date)
            .unwrap_or_else(|| "never (no results)".into())
    }

    pub(crate) fn extra(&self, name: &str) -> Option<&Value> {
        self.extra.get(name)
    }
}

// The report

/// The machine the benches ran on: recorded in `<target>/bench-extra/machine.txt` by the first
/// report after a run (`scripts/benchmarks.sh` clears `bench-extra/` before benchmarking), so a
/// later `--report-only` elsewhere still names the machine that measured.
pub(crate) fn recorded_machine(target: &Path) -> String {
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
pub(crate) fn machine() -> String {
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
