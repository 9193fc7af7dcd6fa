//! The loss curve as a PNG, drawn with plotters' bitmap backend from the CSV the training
//! loop writes (so a resumed run's plot shows the whole run). Text uses an embedded DejaVu
//! Sans Mono (`models/data/FONT.md`) through plotters' `ab_glyph` feature: no system fonts or
//! fontconfig are needed, on any machine.

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use rtx_core::{Result, RtxError};
use std::path::Path;
use std::sync::OnceLock;

static FONT: &[u8] = include_bytes!("../data/DejaVuSansMono.ttf");

/// Whether the embedded font registered (plotters keeps fonts in a process-wide table).
static FONT_REGISTERED: OnceLock<bool> = OnceLock::new();

/// One row of the curve CSV.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    pub step: f64,
    pub train_loss: f64,
    pub val_loss: f64,
}

/// The rows of a `step,seconds,train_loss,val_loss` CSV; a malformed line is an error naming
/// its number.
pub fn read_curve(csv: &Path) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(csv).map_err(|source| RtxError::Io {
        path: csv.display().to_string(),
        source,
    })?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let fields: Vec<f64> = line
            .split(',')
            .map(|f| f.trim().parse::<f64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                RtxError::Invalid(format!(
                    "{} line {}: expected step,seconds,train_loss,val_loss numbers, found `{line}`",
                    csv.display(),
                    i + 1
                ))
            })?;
        match fields[..] {
            [step, _, train_loss, val_loss] => rows.push(Row {
                step,
                train_loss,
                val_loss,
            }),
            _ => {
                return Err(RtxError::Invalid(format!(
                    "{} line {}: expected 4 fields, found {}",
                    csv.display(),
                    i + 1,
                    fields.len()
                )));
            }
        }
    }
    Ok(rows)
}

/// Draws training and validation loss against the step into a 900 x 560 PNG at `png`.
pub fn plot_curve(rows: &[Row], png: &Path, title: &str) -> Result<()> {
    let font_ok = *FONT_REGISTERED
        .get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    let failed = |e: String| RtxError::Invalid(format!("plotting {}: {e}", png.display()));
    if !font_ok {
        return Err(failed("the embedded font does not load".into()));
    }
    if rows.is_empty() {
        return Err(failed("the curve has no points yet".into()));
    }
    let finite = rows
        .iter()
        .flat_map(|r| [r.train_loss, r.val_loss])
        .filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return Err(failed("no finite loss to draw".into()));
    }
    let margin = ((hi - lo) * 0.05).max(1e-3);
    let last_step = rows.iter().map(|r| r.step).fold(1.0, f64::max);

    let root = BitMapBackend::new(png, (900, 560)).into_drawing_area();
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..last_step, (lo - margin)..(hi + margin))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("loss (nats per character)")
            .label_style(("sans-serif", 15))
            .draw()?;
        type Series = (&'static str, RGBColor, fn(&Row) -> f64);
        let series: [Series; 2] = [
            ("train", BLUE, |r| r.train_loss),
            ("validation", RED, |r| r.val_loss),
        ];
        for (name, color, loss) in series {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .map(|r| (r.step, loss(r)))
                .filter(|(_, v)| v.is_finite())
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rtx-plot-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_curve_csv_becomes_a_png() {
        let dir = scratch("png");
        let csv = dir.join("curve.csv");
        std::fs::write(
            &csv,
            "step,seconds,train_loss,val_loss\n10,1.0,4.1,3.9\n20,2.0,3.0,2.8\n30,3.0,2.4,2.5\n",
        )
        .unwrap();
        let png = dir.join("curve.png");

        let rows = read_curve(&csv).unwrap();
        plot_curve(&rows, &png, "test curve").unwrap();

        assert_eq!(rows.len(), 3);
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // Width and height from the IHDR chunk.
        assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 900);
        assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 560);
    }

    #[test]
    fn a_malformed_csv_line_is_an_error_naming_it() {
        let dir = scratch("bad");
        let csv = dir.join("curve.csv");
        std::fs::write(
            &csv,
            "step,seconds,train_loss,val_loss\n10,1.0,4.1,3.9\n20,x,3,2\n",
        )
        .unwrap();

        let err = read_curve(&csv).unwrap_err().to_string();

        assert!(err.contains("line 3") && err.contains("20,x,3,2"), "{err}");
    }

    #[test]
    fn an_empty_curve_is_an_error_not_an_empty_plot() {
        let dir = scratch("empty");

        let err = plot_curve(&[], &dir.join("curve.png"), "empty").unwrap_err();

        assert!(err.to_string().contains("no points"), "{err}");
    }
}
