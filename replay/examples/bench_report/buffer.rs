//! The buffer wrapper's section of BENCHMARKS.md (benches/buffer.rs).

use super::*;

/// The buffer wrapper's cost: `Buffer` allocate + drop against the bare pair (benches/buffer.rs).
pub(crate) fn buffer_section(out: &mut String, d: &Data, verdicts: &mut Vec<Verdict>) {
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
