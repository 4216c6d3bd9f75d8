//! `--plot`: live and reserved bytes over a trace, one line per allocator, as SVG or PNG.

use std::path::Path;

use plotters::prelude::*;
use vmm_replay::replay::ReplayOutcome;

const GIB: f64 = (1u64 << 30) as f64;
const WIDTH: u32 = 1100;
const HEIGHT: u32 = 550;

/// Checks the plot's file name before any work is done.
pub fn check_path(path: &Path) -> Result<(), String> {
    match extension(path).as_deref() {
        Some("svg" | "png") => Ok(()),
        _ => Err(format!(
            "--plot {}: the file name must end in .svg or .png",
            path.display()
        )),
    }
}

fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// Draws the live bytes (from the first outcome) and every allocator's reserved bytes into
/// `path`, as SVG or PNG by its extension.
pub fn draw(path: &Path, title: &str, outcomes: &[&ReplayOutcome]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: cannot draw the plot: {e}", path.display());
    let svg = svg(title, outcomes).map_err(|e| err(&e))?;
    let bytes = if extension(path).as_deref() == Some("png") {
        png(&svg).map_err(|e| err(&e))?
    } else {
        svg.into_bytes()
    };
    std::fs::write(path, bytes).map_err(|e| err(&e))
}

fn svg(title: &str, outcomes: &[&ReplayOutcome]) -> Result<String, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let max_x = outcomes
        .iter()
        .flat_map(|o| o.timeline.last())
        .map(|p| p.event)
        .max()
        .unwrap_or(1)
        .max(1);
    let max_y = outcomes
        .iter()
        .flat_map(|o| o.timeline.iter())
        .map(|p| p.reserved.max(p.live))
        .max()
        .unwrap_or(1) as f64
        / GIB;
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0u64..max_x, 0f64..(max_y * 1.08).max(1e-3))
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("event")
            .y_desc("GiB")
            .draw()
            .map_err(|x| e(&x))?;
        if let Some(first) = outcomes.first() {
            let live = first
                .timeline
                .iter()
                .map(|p| (p.event, p.live as f64 / GIB));
            chart
                .draw_series(LineSeries::new(live, BLACK.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label("live (requested)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        }
        let palette = [RED, BLUE, GREEN, MAGENTA, CYAN];
        for (o, color) in outcomes.iter().zip(palette.iter().cycle()) {
            let color = *color;
            let reserved = o
                .timeline
                .iter()
                .map(|p| (p.event, p.reserved as f64 / GIB));
            chart
                .draw_series(LineSeries::new(reserved, color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(format!("reserved: {}", crate::report::label(o)))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
    }
    Ok(text)
}

/// Rasterizes the SVG with the system's fonts; without any, the lines are drawn and the text is
/// not, and a warning says so.
fn png(svg: &str) -> Result<Vec<u8>, String> {
    use resvg::{tiny_skia, usvg};
    let mut options = usvg::Options::default();
    let db = options.fontdb_mut();
    db.load_system_fonts();
    // fontdb maps `sans-serif` to Arial, which Linux machines rarely have: use a sans family
    // that is installed, else any family.
    let installed = |sans: bool| {
        db.faces()
            .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
            .find(|name| !sans || name.contains("Sans"))
    };
    match installed(true).or_else(|| installed(false)) {
        Some(family) => {
            db.set_sans_serif_family(family.clone());
            options.font_family = family;
        }
        None => eprintln!(
            "vmm-replay: warning: no system fonts found, so the PNG has no text; use .svg for a plot with labels"
        ),
    }
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| e.to_string())?;
    let mut pixmap = tiny_skia::Pixmap::new(WIDTH, HEIGHT).ok_or("cannot allocate the image")?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| e.to_string())
}
