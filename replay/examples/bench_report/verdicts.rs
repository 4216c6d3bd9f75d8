//! The targets' verdicts ("met"/"missed"), listed at the top of the report.

use super::*;

/// A target's verdict, listed at the top of the report.
pub(crate) struct Verdict {
    pub(crate) target: String,
    pub(crate) measured: String,
    pub(crate) met: Option<bool>,
}

impl Verdict {
    pub(crate) fn status(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "not measured",
        }
    }
}

/// The hot-path targets: expandable at most 100 ns in every case and never slower than classic.
pub(crate) fn hot_path_verdicts(d: &Data, group: &str, label: &str) -> Vec<Verdict> {
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

/// The growth targets: zero creations on warm regrowth (from the side output) and, when
/// `within` is given, expandable's growth within that factor of the raw loop with the same pages.
pub(crate) fn growth_verdicts(
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

pub(crate) fn write_verdicts(out: &mut String, verdicts: &[Verdict]) {
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

/// Issue 19's scaling target: 2 threads on 2 streams do at least 1.5× the operations of one, per
/// workload (`groups`: the 1- and 2-thread groups of one bench), for the default allocator (its
/// front cache engaged on contention), with the front cache always on, and with it off (one
/// lock); met if the default reaches it (or, in a run without it, either other).
pub(crate) fn threads_verdict(d: &Data, groups: &[String], label: &str) -> Verdict {
    let target = format!("{label}: 2 threads on 2 streams ≥ 1.5× the operations of one");
    let one = groups.iter().find(|g| g.ends_with("/1"));
    let two = groups.iter().find(|g| g.ends_with("/2"));
    let measured: Vec<(&str, f64)> = [
        "expandable",
        "expandable-front-cache",
        "expandable-single-lock",
    ]
    .into_iter()
    .filter_map(|f| Some((f, scaling(d, one?, two?, f)?)))
    .collect();
    if measured.is_empty() {
        return Verdict {
            target,
            measured: "no results".into(),
            met: None,
        };
    }
    Verdict {
        target,
        measured: measured
            .iter()
            .map(|(f, s)| format!("{f} {}×", ratio(*s)))
            .collect::<Vec<_>>()
            .join(", "),
        met: Some(match measured.iter().find(|(f, _)| *f == "expandable") {
            Some((_, s)) => *s >= 1.5,
            None => measured.iter().any(|(_, s)| *s >= 1.5),
        }),
    }
}
