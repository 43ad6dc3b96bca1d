//! The bench-recall chart, drawn with `plotters`: a panel per level shown
//! (session, turn), recall_any@k against the cut-offs, one line with a point
//! per cut-off for each mode, axes, labels and a legend. Written as SVG and
//! PNG; the PNG's text uses the DejaVu Sans face the `dejavu` crate embeds, so
//! no system font is needed.

use std::sync::Once;

use plotters::coord::ranged1d::SegmentValue;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::run::RunReport;

pub const WIDTH: u32 = 1200;
pub const HEIGHT: u32 = 520;

/// The family the chart's text is set in.
const FONT: &str = "sans-serif";

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One point as drawn: the mode and level it belongs to, the cut-off, the
/// value, and where it landed in pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    pub level: &'static str,
    pub mode: String,
    pub k: usize,
    pub value: f64,
    pub at: (i32, i32),
}

/// A panel's plotting area in pixels: x from `left` to `right`, y from `top`
/// (value 1) to `bottom` (value 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Area {
    pub left: i32,
    pub right: i32,
    pub top: i32,
    pub bottom: i32,
}

/// What was drawn: the panels' plotting areas (in level order) and the points.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    pub panels: Vec<(&'static str, Area)>,
    pub points: Vec<Drawn>,
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The face is a valid TrueType file: a failure here is a build defect.
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans face is not a valid font"));
    });
}

type DrawResult<T> = Result<T, String>;

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing the chart: {e:?}")
}

/// Draw the report on `root`.
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    report: &RunReport,
) -> DrawResult<Layout> {
    register_font();
    root.fill(&WHITE).map_err(err)?;
    let mut layout = Layout::default();
    let levels = &report.levels;
    if levels.is_empty() || report.ks.is_empty() {
        return Ok(layout);
    }
    let n = report.ks.len();
    let panels = root.split_evenly((1, levels.len()));
    for (level, area) in levels.iter().zip(&panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{level} recall_any@k ({} questions)", report.questions),
                (FONT, 20),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((0..n as i32 - 1).into_segmented(), 0.0f64..1.0)
            .map_err(err)?;
        let ks = &report.ks;
        let label = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => ks
                .get(*i as usize)
                .map(|k| k.to_string())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .x_desc("k")
            .y_desc("recall_any@k")
            .x_labels(n)
            .y_labels(11)
            .x_label_formatter(&label)
            .y_label_formatter(&|v| format!("{v:.1}"))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (m, (mode, summary)) in report.modes.iter().enumerate() {
            let s = if *level == "turn" {
                &summary.turn
            } else {
                &summary.session
            };
            let colour = COLOURS[m % COLOURS.len()];
            let pts: Vec<(SegmentValue<i32>, f64, usize)> = report
                .ks
                .iter()
                .enumerate()
                .filter_map(|(i, k)| {
                    s.at.get(k)
                        .map(|x| (SegmentValue::CenterOf(i as i32), x.recall_any, *k))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|(x, y, _)| (x.clone(), *y)),
                    colour.stroke_width(2),
                ))
                .map_err(err)?
                .label(mode.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(
                    pts.iter()
                        .map(|(x, y, _)| Circle::new((x.clone(), *y), 4, colour.filled())),
                )
                .map_err(err)?;
            for (x, y, k) in &pts {
                layout.points.push(Drawn {
                    level,
                    mode: mode.clone(),
                    k: *k,
                    value: *y,
                    at: chart.backend_coord(&(x.clone(), *y)),
                });
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(err)?;
        let (xs, ys) = chart.plotting_area().get_pixel_range();
        layout.panels.push((
            level,
            Area {
                left: xs.start,
                right: xs.end,
                top: ys.start,
                bottom: ys.end,
            },
        ));
    }
    root.present().map_err(err)?;
    Ok(layout)
}

/// The chart as an SVG document, and what was drawn.
pub fn svg(report: &RunReport) -> DrawResult<(String, Layout)> {
    let mut out = String::new();
    let layout = {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, report)?
    };
    Ok((out, layout))
}

/// Write the chart as a PNG file at `path`.
pub fn png(report: &RunReport, path: &std::path::Path) -> DrawResult<Layout> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    draw(&root, report)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench_recall::metrics::{Scores, Summary};
    use crate::bench_recall::run::ModeSummary;

    fn summary(values: &[(usize, f64)]) -> Summary {
        Summary {
            questions: 10,
            at: values
                .iter()
                .map(|&(k, v)| {
                    (
                        k,
                        Scores {
                            recall_any: v,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        }
    }

    fn report() -> RunReport {
        let ks = vec![1, 3, 5, 10, 30, 50];
        let mut modes = BTreeMap::new();
        let curves = [
            ("bm25", [0.41, 0.67, 0.77, 0.79, 0.80, 0.82]),
            ("hybrid", [0.83, 0.92, 0.95, 0.98, 1.0, 1.0]),
            ("vector", [0.0, 0.25, 0.5, 0.66, 0.9, 0.99]),
        ];
        for (i, (mode, v)) in curves.iter().enumerate() {
            let session: Vec<(usize, f64)> = ks.iter().copied().zip(v.iter().copied()).collect();
            // The turn level differs from the session level, per mode.
            let turn: Vec<(usize, f64)> = session
                .iter()
                .map(|&(k, x)| (k, x * (0.5 + 0.1 * i as f64)))
                .collect();
            modes.insert(
                mode.to_string(),
                ModeSummary {
                    session: summary(&session),
                    turn: summary(&turn),
                    ..Default::default()
                },
            );
        }
        RunReport {
            ks,
            levels: vec!["session", "turn"],
            questions: 10,
            modes,
            ..Default::default()
        }
    }

    /// `(cx, cy)` of every `<circle>` in an SVG document.
    fn circles(svg: &str) -> Vec<(i32, i32)> {
        let attr = |tag: &str, name: &str| -> i32 {
            let at = tag.find(&format!(" {name}=\"")).expect(name) + name.len() + 3;
            tag[at..at + tag[at..].find('"').unwrap()].parse().unwrap()
        };
        svg.split("<circle")
            .skip(1)
            .map(|tag| (attr(tag, "cx"), attr(tag, "cy")))
            .collect()
    }

    #[test]
    fn every_point_is_drawn_where_its_value_and_cut_off_put_it() {
        let report = report();
        let (svg, layout) = svg(&report).unwrap();
        assert_eq!(layout.panels.len(), 2);
        let drawn = circles(&svg);
        // One point per mode, level and cut-off: 3 × 2 × 6.
        assert_eq!(drawn.len(), 36, "{drawn:?}");
        assert_eq!(layout.points.len(), 36);
        for (level, area) in &layout.panels {
            // The cut-offs are evenly spaced, in order, inside the panel.
            let height = f64::from(area.bottom - area.top);
            let width = f64::from(area.right - area.left);
            for (mode, s) in &report.modes {
                let summary = if *level == "turn" {
                    &s.turn
                } else {
                    &s.session
                };
                let mut xs = Vec::new();
                for (k, scores) in &summary.at {
                    // The circle drawn for this value, read back from the SVG.
                    let p = layout
                        .points
                        .iter()
                        .find(|p| p.level == *level && &p.mode == mode && p.k == *k)
                        .unwrap_or_else(|| panic!("no point for {level} {mode} @{k}"));
                    assert!(drawn.contains(&p.at), "{level} {mode} @{k}: {:?}", p.at);
                    let (x, y) = p.at;
                    assert!(
                        (area.left..area.right).contains(&x)
                            && (area.top..=area.bottom).contains(&y),
                        "{level} {mode} @{k} at {:?} is outside its panel {area:?}",
                        p.at
                    );
                    let read = f64::from(area.bottom - y) / height;
                    assert!(
                        (read - scores.recall_any).abs() <= 1.5 / height,
                        "{level} {mode} @{k}: drawn at {read:.3}, value {}",
                        scores.recall_any
                    );
                    let i = report.ks.iter().position(|x| x == k).unwrap();
                    let slot = (f64::from(x - area.left) / width * report.ks.len() as f64) as usize;
                    assert_eq!(slot, i, "{level} {mode} @{k} drawn in slot {slot}");
                    xs.push(x);
                }
                assert_eq!(xs.len(), report.ks.len());
            }
        }
        // Labels and a legend entry for each mode.
        for text in [
            "session recall_any@k",
            "turn recall_any@k",
            "bm25",
            "hybrid",
            "vector",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn the_png_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.png");
        let layout = png(&report(), &path).unwrap();
        assert_eq!(layout.points.len(), 36);
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        // IHDR: width and height.
        assert_eq!(&bytes[16..20], &WIDTH.to_be_bytes());
        assert_eq!(&bytes[20..24], &HEIGHT.to_be_bytes());
    }
}
