//! How figures are written: dates, times, ratios, rates, sizes, Markdown rows.

use super::*;

/// `YYYY-MM-DD` (UTC) of a time.
pub(crate) fn date(t: SystemTime) -> String {
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
pub(crate) fn sig3(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

pub(crate) fn time(ns: f64) -> String {
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

pub(crate) fn ratio(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.1}")
    } else if r >= 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.3}")
    }
}

/// A rate in millions (or thousands) per second.
pub(crate) fn rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2} M", per_s / 1e6)
    } else {
        format!("{:.1} k", per_s / 1e3)
    }
}

/// An integer with thousands separators.
pub(crate) fn int(n: u64) -> String {
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

pub(crate) fn mib(bytes: u64) -> String {
    format!("{} MiB", int((bytes as f64 / MIB).round() as u64))
}

/// `lo–hi` of some values, formatted, or `lo` when equal.
pub(crate) fn range(values: &[f64], f: fn(f64) -> String) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (f(lo), f(hi));
    if a == b {
        a
    } else {
        format!("{a}–{b}")
    }
}

pub(crate) fn row(out: &mut String, cells: &[String]) {
    writeln!(out, "| {} |", cells.join(" | ")).expect("write to a String");
}

pub(crate) fn header(out: &mut String, cells: &[String]) {
    row(out, cells);
    row(out, &vec!["---".to_string(); cells.len()]);
}
