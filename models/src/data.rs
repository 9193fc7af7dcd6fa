//! The 8x8 handwritten digits data set (UCI "Optical Recognition of
//! Handwritten Digits", the copy shipped by scikit-learn; see
//! `models/data/README.md` for origin, license and format).
//!
//! The gzip file is embedded in the binary, parsed into `f32` pixels scaled
//! to `0..=1` and `i64` labels, and split into train and test sets by a
//! seeded shuffle that does not depend on any random-number crate.

use std::fmt;
use std::io::Read;

use flate2::read::GzDecoder;

/// The embedded file, so the binary trains with no files at run time.
pub const DIGITS_CSV_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

/// Pixels per image (8x8).
pub const PIXELS: usize = 64;
/// Side of an image in pixels.
pub const IMAGE_SIDE: usize = 8;
/// Number of classes (digits 0..=9).
pub const CLASSES: usize = 10;
/// Largest raw pixel value in the file; pixels are divided by it.
const MAX_PIXEL: f32 = 16.0;

/// Images and labels of a digits data set (or a subset of it).
#[derive(Debug, Clone, PartialEq)]
pub struct Digits {
    /// `len * 64` pixels, row-major 8x8 per image, scaled into `0..=1`
    /// (raw value / 16).
    pub images: Vec<f32>,
    /// `len` labels, each 0..=9.
    pub labels: Vec<i64>,
    /// Number of images.
    pub len: usize,
}

/// Why the digits file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataError {
    /// The gzip stream is corrupt or truncated.
    Decompress(String),
    /// A row of the CSV does not hold 64 pixels 0..=16 and a label 0..=9.
    BadRow {
        /// 1-based line number in the decompressed CSV.
        line: usize,
        /// What the parser expected.
        expected: String,
        /// What it found instead.
        found: String,
    },
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataError::Decompress(msg) => write!(f, "digits data: cannot decompress: {msg}"),
            DataError::BadRow {
                line,
                expected,
                found,
            } => write!(
                f,
                "digits data, line {line}: expected {expected}, found {found}"
            ),
        }
    }
}

impl std::error::Error for DataError {}

fn bad_row(line: usize, expected: impl Into<String>, found: impl Into<String>) -> DataError {
    DataError::BadRow {
        line,
        expected: expected.into(),
        found: found.into(),
    }
}

/// Shows a field of the input in an error message, cut to a readable length.
fn quote(field: &str) -> String {
    const MAX: usize = 20;
    match field.char_indices().nth(MAX) {
        Some((cut, _)) => format!("`{}...`", &field[..cut]),
        None => format!("`{field}`"),
    }
}

/// Parses one CSV line (without its `\n`) into `images` and `labels`.
fn parse_row(
    line_no: usize,
    line: &[u8],
    images: &mut Vec<f32>,
    labels: &mut Vec<i64>,
) -> Result<(), DataError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line)
        .map_err(|_| bad_row(line_no, "UTF-8 text", "bytes that are not UTF-8"))?;
    if text.trim().is_empty() {
        return Err(bad_row(
            line_no,
            "65 comma-separated values (64 pixels and a label)",
            "an empty line",
        ));
    }
    let count = text.split(',').count();
    if count != PIXELS + 1 {
        return Err(bad_row(
            line_no,
            "65 comma-separated values (64 pixels and a label)",
            format!("{count} value{}", if count == 1 { "" } else { "s" }),
        ));
    }
    let start = images.len();
    let mut fields = text.split(',').map(str::trim);
    for column in 1..=PIXELS {
        let field = fields.next().unwrap_or("");
        match field.parse::<f32>() {
            Ok(v) if (0.0..=MAX_PIXEL).contains(&v) => images.push(v / MAX_PIXEL),
            _ => {
                images.truncate(start);
                return Err(bad_row(
                    line_no,
                    format!("a pixel value 0..=16 in column {column}"),
                    quote(field),
                ));
            }
        }
    }
    let field = fields.next().unwrap_or("");
    match field.parse::<i64>() {
        Ok(label) if (0..CLASSES as i64).contains(&label) => labels.push(label),
        _ => {
            images.truncate(start);
            return Err(bad_row(
                line_no,
                format!("a label 0..=9 in column {}", PIXELS + 1),
                quote(field),
            ));
        }
    }
    Ok(())
}

/// Decompresses and parses a gzip CSV of digits (64 pixels 0..=16, then
/// the label 0..=9, per line).
///
/// Never panics on bad input: a corrupt or truncated gzip stream gives
/// [`DataError::Decompress`], and any malformed row (wrong number of values,
/// a pixel or label that is not a number in range, an empty line) gives
/// [`DataError::BadRow`] with its 1-based line number. One trailing newline
/// at the end of the file is allowed, and `\r\n` line endings are accepted.
/// An input with no rows at all is an error.
pub fn parse_digits(gz: &[u8]) -> Result<Digits, DataError> {
    let mut csv = Vec::new();
    GzDecoder::new(gz)
        .read_to_end(&mut csv)
        .map_err(|e| DataError::Decompress(e.to_string()))?;

    let body = csv.strip_suffix(b"\n").unwrap_or(&csv);
    if body.is_empty() {
        return Err(bad_row(
            1,
            "a row of 64 pixels and a label",
            "the end of the data",
        ));
    }
    let rows = body.split(|&b| b == b'\n').count();
    let mut images = Vec::with_capacity(rows * PIXELS);
    let mut labels = Vec::with_capacity(rows);
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        parse_row(i + 1, line, &mut images, &mut labels)?;
    }
    Ok(Digits {
        len: labels.len(),
        images,
        labels,
    })
}

/// Parses the embedded file, [`DIGITS_CSV_GZ`] (1797 images).
pub fn load_digits() -> Result<Digits, DataError> {
    parse_digits(DIGITS_CSV_GZ)
}

/// splitmix64 (Steele, Lea, Flood 2014): a small, fixed, seedable generator,
/// so a split is the same on every platform and every build.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (`bound >= 1`), by multiply-shift.
    fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }
}

impl Digits {
    /// Fixed seeded shuffle (own splitmix64 Fisher-Yates; no rand crate),
    /// then the last `round(len * test_fraction)` rows are the test set and
    /// the others the training set: `(train, test)`.
    ///
    /// `test_fraction` is clamped into `0..=1` (NaN counts as 0). For the
    /// 1797 embedded digits, `split(0.2, seed)` gives 1438 training and 359
    /// test images (1797 * 0.2 = 359.4 rounds to 359).
    pub fn split(&self, test_fraction: f64, seed: u64) -> (Digits, Digits) {
        let fraction = if test_fraction.is_nan() {
            0.0
        } else {
            test_fraction.clamp(0.0, 1.0)
        };
        let n_test = ((self.len as f64) * fraction).round() as usize;
        let n_test = n_test.min(self.len);

        let mut order: Vec<usize> = (0..self.len).collect();
        let mut rng = SplitMix64(seed);
        for i in (1..order.len()).rev() {
            let j = rng.below(i + 1);
            order.swap(i, j);
        }
        let (train, test) = order.split_at(self.len - n_test);
        (self.gather(train), self.gather(test))
    }

    /// Rows `idx` gathered into a batch: (images `[idx.len() * 64]`, labels).
    ///
    /// # Panics
    ///
    /// If an index is `>= self.len`, like slice indexing.
    pub fn batch(&self, idx: &[usize]) -> (Vec<f32>, Vec<i64>) {
        let mut images = Vec::with_capacity(idx.len() * PIXELS);
        let mut labels = Vec::with_capacity(idx.len());
        for &i in idx {
            images.extend_from_slice(&self.images[i * PIXELS..(i + 1) * PIXELS]);
            labels.push(self.labels[i]);
        }
        (images, labels)
    }

    fn gather(&self, idx: &[usize]) -> Digits {
        let (images, labels) = self.batch(idx);
        Digits {
            images,
            labels,
            len: idx.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;

    fn gz(text: &str) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap()
    }

    /// A valid row: 64 pixels (all `pixel`) and `label`.
    fn row(pixel: u32, label: i64) -> String {
        let mut s = vec![pixel.to_string(); PIXELS].join(",");
        s.push_str(&format!(",{label}\n"));
        s
    }

    fn class_counts(d: &Digits) -> [usize; CLASSES] {
        let mut counts = [0; CLASSES];
        for &l in &d.labels {
            counts[l as usize] += 1;
        }
        counts
    }

    #[test]
    fn loads_embedded_digits() {
        let d = load_digits().unwrap();
        assert_eq!(d.len, 1797);
        assert_eq!(d.labels.len(), 1797);
        assert_eq!(d.images.len(), 1797 * PIXELS);
        assert!(d.images.iter().all(|&p| (0.0..=1.0).contains(&p)));
        assert!(d.images.contains(&1.0));
        // First row of the file: 0,0,5,13,9,1,0,0,... label 0.
        assert_eq!(&d.images[..4], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0]);
        assert_eq!(d.labels[0], 0);
        assert_eq!(d.labels[1796], 8);
    }

    #[test]
    fn labels_in_range_and_all_present() {
        let d = load_digits().unwrap();
        assert!(d.labels.iter().all(|l| (0..10).contains(l)));
        let counts = class_counts(&d);
        assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    }

    #[test]
    fn split_sizes_and_partition() {
        let d = load_digits().unwrap();
        let (train, test) = d.split(0.2, 42);
        assert_eq!((train.len, test.len), (1438, 359));
        assert_eq!(train.images.len(), 1438 * PIXELS);
        assert_eq!(test.images.len(), 359 * PIXELS);
        let (a, b) = (class_counts(&train), class_counts(&test));
        let sum: Vec<usize> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(sum, class_counts(&d).to_vec());
        assert!(b.iter().all(|&c| c > 0), "every class in the test set");
    }

    #[test]
    fn split_is_deterministic_per_seed() {
        let d = load_digits().unwrap();
        let (train1, test1) = d.split(0.2, 7);
        let (train2, test2) = d.split(0.2, 7);
        assert_eq!(train1, train2);
        assert_eq!(test1, test2);
        let (train3, test3) = d.split(0.2, 8);
        assert_ne!(test1.labels, test3.labels);
        assert_ne!(train1.images, train3.images);
    }

    #[test]
    fn split_edge_fractions() {
        let d = parse_digits(&gz(&(row(1, 1) + &row(2, 2) + &row(3, 3)))).unwrap();
        let (train, test) = d.split(0.0, 1);
        assert_eq!((train.len, test.len), (3, 0));
        let (train, test) = d.split(1.0, 1);
        assert_eq!((train.len, test.len), (0, 3));
        let (train, test) = d.split(f64::NAN, 1);
        assert_eq!((train.len, test.len), (3, 0));
        let (train, test) = d.split(5.0, 1);
        assert_eq!((train.len, test.len), (0, 3));
        let mut all = test.labels.clone();
        all.sort();
        assert_eq!(all, vec![1, 2, 3]);
    }

    #[test]
    fn batch_gathers_rows() {
        let d = parse_digits(&gz(&(row(0, 5) + &row(16, 6) + &row(8, 7)))).unwrap();
        let (images, labels) = d.batch(&[2, 0, 2]);
        assert_eq!(labels, vec![7, 5, 7]);
        assert_eq!(images.len(), 3 * PIXELS);
        assert!(images[..PIXELS].iter().all(|&p| p == 0.5));
        assert!(images[PIXELS..2 * PIXELS].iter().all(|&p| p == 0.0));
        let (images, labels) = d.batch(&[]);
        assert!(images.is_empty() && labels.is_empty());
        assert_eq!(d.batch(&[1]).0, vec![1.0; PIXELS]);
    }

    #[test]
    fn truncated_gzip_is_an_error() {
        let half = &DIGITS_CSV_GZ[..DIGITS_CSV_GZ.len() / 2];
        assert!(matches!(parse_digits(half), Err(DataError::Decompress(_))));
        let tail_cut = &DIGITS_CSV_GZ[..DIGITS_CSV_GZ.len() - 4];
        assert!(matches!(
            parse_digits(tail_cut),
            Err(DataError::Decompress(_))
        ));
    }

    #[test]
    fn not_gzip_is_an_error() {
        let err = parse_digits(b"0,0,0\n").unwrap_err();
        assert!(matches!(err, DataError::Decompress(_)), "{err}");
        assert!(parse_digits(&[]).is_err());
    }

    #[test]
    fn short_row_names_line_and_counts() {
        let short = vec!["0"; PIXELS - 1].join(",") + "\n";
        let text = row(0, 1) + &row(1, 2) + &short + &row(2, 3);
        let err = parse_digits(&gz(&text)).unwrap_err();
        assert_eq!(
            err,
            DataError::BadRow {
                line: 3,
                expected: "65 comma-separated values (64 pixels and a label)".into(),
                found: "63 values".into(),
            }
        );
        assert_eq!(
            err.to_string(),
            "digits data, line 3: expected 65 comma-separated values (64 pixels and a label), found 63 values"
        );
    }

    #[test]
    fn bad_values_are_errors() {
        let bad_label = row(0, 1) + &row(0, 10);
        let err = parse_digits(&gz(&bad_label)).unwrap_err();
        assert!(
            matches!(&err, DataError::BadRow { line: 2, found, .. } if found == "`10`"),
            "{err}"
        );

        let bad_pixel = row(0, 1).replacen("0,", "0,17,", 1).replacen(",0,", ",", 1);
        let err = parse_digits(&gz(&bad_pixel)).unwrap_err();
        assert!(
            matches!(&err, DataError::BadRow { line: 1, expected, found }
                if expected == "a pixel value 0..=16 in column 2" && found == "`17`"),
            "{err}"
        );

        let not_number = row(0, 1).replacen('0', "x", 1);
        assert!(matches!(
            parse_digits(&gz(&not_number)),
            Err(DataError::BadRow { line: 1, .. })
        ));

        let blank_line = row(0, 1) + "\n" + &row(0, 2);
        assert!(matches!(
            parse_digits(&gz(&blank_line)),
            Err(DataError::BadRow { line: 2, .. })
        ));

        assert!(matches!(
            parse_digits(&gz("")),
            Err(DataError::BadRow { line: 1, .. })
        ));

        let mut not_utf8 = row(0, 1).into_bytes();
        not_utf8[0] = 0xFF;
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(&not_utf8).unwrap();
        assert!(matches!(
            parse_digits(&enc.finish().unwrap()),
            Err(DataError::BadRow { line: 1, .. })
        ));
    }

    #[test]
    fn crlf_and_no_final_newline_are_accepted() {
        let text = row(4, 3).replace('\n', "\r\n") + row(16, 9).trim_end();
        let d = parse_digits(&gz(&text)).unwrap();
        assert_eq!(d.len, 2);
        assert_eq!(d.labels, vec![3, 9]);
        assert_eq!(d.images[0], 0.25);
    }
}
