//! `advise --report FILE.html`: one self-contained page (inline SVG and CSS, no scripts, no
//! fonts or anything else fetched) with the sweep's table, the recommendation, live and reserved
//! over the trace for each configuration, and the OOM picture.

use std::fmt::Write;

use vmm_alloc::units::human_bytes;
use vmm_replay::advise::Verdict;
use vmm_replay::diagnosis::OomMoment;

const W: f64 = 420.0;
const H: f64 = 150.0;

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page.
pub fn page(
    name: &str,
    basis: &str,
    table: &str,
    advice: &str,
    verdicts: &[Verdict],
    capacity: u64,
) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>vmm-replay advise: {n}</title>\
<style>body{{font-family:sans-serif;margin:24px;color:#222;background:#fff}}table{{border-collapse:collapse}}\
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}\
.yes{{background:#dfd}}.no{{background:#fdd}}pre{{background:#f4f4f4;padding:12px}}\
.plots{{display:flex;flex-wrap:wrap;gap:12px}}figure{{margin:0}}figcaption{{font-size:12px}}</style></head><body>\
<h1>Would a setting have saved this run?</h1><p><b>{n}</b>: {b}</p><h2>Recommendation</h2><pre>{a}</pre><h2>Configurations</h2>",
        n = esc(name),
        b = esc(basis),
        a = esc(advice)
    );
    h.push_str(&table_html(table));
    h.push_str("<h2>Live and reserved over the trace</h2><p>grey: live; blue: reserved; red: the capacity.</p><div class=\"plots\">");
    let top = verdicts
        .iter()
        .flat_map(|v| {
            v.at_capacity
                .timeline
                .iter()
                .map(|p| p.reserved.max(p.live))
        })
        .max()
        .unwrap_or(1)
        .max(capacity)
        .max(1);
    for v in verdicts {
        let _ = write!(
            h,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            plot(v, top, capacity),
            esc(&v.candidate.name())
        );
    }
    h.push_str("</div>");
    if let Some((v, m)) = verdicts
        .iter()
        .find_map(|v| v.at_capacity.oom_moments.first().map(|m| (v, m)))
    {
        let _ = write!(
            h,
            "<h2>The OOM moment ({})</h2>{}<pre>{}</pre>",
            esc(&v.candidate.name()),
            oom_picture(m),
            esc(&m.describe())
        );
    }
    h.push_str("</body></html>\n");
    h
}

/// The markdown table as an HTML table; the fits column coloured.
fn table_html(table: &str) -> String {
    let mut h = String::from("<table>");
    for (i, line) in table.lines().filter(|l| l.starts_with('|')).enumerate() {
        if i == 1 {
            continue; // the markdown rule
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        h.push_str("<tr>");
        for c in cells {
            let tag = if i == 0 { "th" } else { "td" };
            let class = match c {
                "yes" => " class=\"yes\"",
                "no" => " class=\"no\"",
                _ => "",
            };
            let _ = write!(h, "<{tag}{class}>{}</{tag}>", esc(c));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h
}

fn polyline(points: &[(f64, f64)], colour: &str) -> String {
    let mut s = String::new();
    for (x, y) in points {
        let _ = write!(s, "{x:.1},{y:.1} ");
    }
    format!("<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{s}\"/>")
}

/// One configuration's live and reserved bytes against the capacity, all on one scale.
fn plot(v: &Verdict, top: u64, capacity: u64) -> String {
    let t = &v.at_capacity.timeline;
    let last = t.last().map_or(1, |p| p.event).max(1) as f64;
    let y = |b: u64| H - 12.0 - (b as f64 / top as f64) * (H - 24.0);
    let x = |e: u64| 4.0 + e as f64 / last * (W - 8.0);
    let live: Vec<(f64, f64)> = t.iter().map(|p| (x(p.event), y(p.live))).collect();
    let reserved: Vec<(f64, f64)> = t.iter().map(|p| (x(p.event), y(p.reserved))).collect();
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">\
<rect width=\"{W}\" height=\"{H}\" fill=\"#fafafa\" stroke=\"#ccc\"/>\
<line x1=\"0\" x2=\"{W}\" y1=\"{c:.1}\" y2=\"{c:.1}\" stroke=\"#d00\" stroke-dasharray=\"4 3\"/>{}{}\
<text x=\"6\" y=\"11\" font-size=\"10\" fill=\"#555\">peak reserved {} (capacity {})</text></svg>",
        polyline(&live, "#888"),
        polyline(&reserved, "#1f5fbf"),
        human_bytes(v.at_capacity.peak_reserved_bytes),
        human_bytes(capacity),
        c = y(capacity)
    )
}

/// The device at the OOM moment as one bar: live, reserved but unallocated, never reserved;
/// then the free blocks by size class against the request.
fn oom_picture(m: &OomMoment) -> String {
    let cap = m.capacity_bytes.max(1) as f64;
    let w = |b: u64| b as f64 / cap * (W * 2.0 - 20.0);
    let live = w(m.live_bytes);
    let unalloc = w(m.reserved_unallocated_bytes);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"90\">\
<rect x=\"10\" y=\"10\" width=\"{}\" height=\"24\" fill=\"#eee\" stroke=\"#999\"/>\
<rect x=\"10\" y=\"10\" width=\"{live:.1}\" height=\"24\" fill=\"#888\"/>\
<rect x=\"{:.1}\" y=\"10\" width=\"{unalloc:.1}\" height=\"24\" fill=\"#e9a23b\"/>\
<rect x=\"10\" y=\"44\" width=\"{:.1}\" height=\"12\" fill=\"#d00\"/>\
<rect x=\"10\" y=\"60\" width=\"{:.1}\" height=\"12\" fill=\"#1f5fbf\"/>\
<text x=\"12\" y=\"86\" font-size=\"11\">grey: live {}; orange: reserved but unallocated {}; red: the request {}; blue: the largest free block {}</text></svg>",
        W * 2.0,
        W * 2.0 - 20.0,
        10.0 + live,
        w(m.request).max(1.0),
        w(m.largest_free_bytes).max(1.0),
        human_bytes(m.live_bytes),
        human_bytes(m.reserved_unallocated_bytes),
        human_bytes(m.request),
        human_bytes(m.largest_free_bytes)
    );
    s.push_str("<table><tr><th>free blocks</th><th>count</th><th>bytes</th></tr>");
    for c in &m.free_by_size {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.label()),
            c.count,
            human_bytes(c.bytes)
        );
    }
    s.push_str("</table>");
    s
}
