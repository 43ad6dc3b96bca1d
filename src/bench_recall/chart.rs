//! The bench-recall chart: recall_any@k curves per mode, at session and at turn
//! level, as a PNG. Drawn on a small palette canvas with a built-in 5×7 font and
//! written as an uncompressed (stored-deflate) palette PNG — a few hundred KB,
//! no image or font dependency.

use std::collections::BTreeMap;

use super::metrics::Summary;
use super::run::RunReport;

const WIDTH: usize = 960;
const HEIGHT: usize = 400;
const PANEL: usize = WIDTH / 2;

/// Palette indexes.
const WHITE: u8 = 0;
const BLACK: u8 = 1;
const GRID: u8 = 2;
/// Colours of the modes, in order.
const LINES: [u8; 5] = [3, 4, 5, 6, 7];
const PALETTE: [[u8; 3]; 8] = [
    [255, 255, 255],
    [30, 30, 30],
    [225, 225, 225],
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
];

/// 5×7 glyphs (rows top to bottom, `#` = ink); other characters draw blank.
fn glyph(c: char) -> Option<[&'static str; 7]> {
    Some(match c {
        '0' => [
            " ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### ",
        ],
        '1' => [
            "  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### ",
        ],
        '2' => [
            " ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####",
        ],
        '3' => [
            "#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### ",
        ],
        '4' => [
            "   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # ",
        ],
        '5' => [
            "#####", "#    ", "#### ", "    #", "    #", "#   #", " ### ",
        ],
        '6' => [
            "  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### ",
        ],
        '7' => [
            "#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   ",
        ],
        '8' => [
            " ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### ",
        ],
        '9' => [
            " ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  ",
        ],
        '.' => [
            "     ", "     ", "     ", "     ", "     ", " ##  ", " ##  ",
        ],
        '_' => [
            "     ", "     ", "     ", "     ", "     ", "     ", "#####",
        ],
        '-' => [
            "     ", "     ", "     ", "#####", "     ", "     ", "     ",
        ],
        '=' => [
            "     ", "     ", "#####", "     ", "#####", "     ", "     ",
        ],
        '@' => [
            " ### ", "#   #", "# ###", "# # #", "# ###", "#    ", " ### ",
        ],
        'a' => [
            "     ", "     ", " ### ", "    #", " ####", "#   #", " ####",
        ],
        'b' => [
            "#    ", "#    ", "# ## ", "##  #", "#   #", "#   #", "#### ",
        ],
        'c' => [
            "     ", "     ", " ### ", "#    ", "#    ", "#   #", " ### ",
        ],
        'd' => [
            "    #", "    #", " ## #", "#  ##", "#   #", "#   #", " ####",
        ],
        'e' => [
            "     ", "     ", " ### ", "#   #", "#####", "#    ", " ### ",
        ],
        'h' => [
            "#    ", "#    ", "# ## ", "##  #", "#   #", "#   #", "#   #",
        ],
        'i' => [
            "  #  ", "     ", " ##  ", "  #  ", "  #  ", "  #  ", " ### ",
        ],
        'k' => [
            "#    ", "#    ", "#  # ", "# #  ", "##   ", "# #  ", "#  # ",
        ],
        'l' => [
            " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### ",
        ],
        'm' => [
            "     ", "     ", "## # ", "# # #", "# # #", "#   #", "#   #",
        ],
        'n' => [
            "     ", "     ", "# ## ", "##  #", "#   #", "#   #", "#   #",
        ],
        'o' => [
            "     ", "     ", " ### ", "#   #", "#   #", "#   #", " ### ",
        ],
        'r' => [
            "     ", "     ", "# ## ", "##  #", "#    ", "#    ", "#    ",
        ],
        's' => [
            "     ", "     ", " ####", "#    ", " ### ", "    #", "#### ",
        ],
        't' => [
            " #   ", " #   ", "###  ", " #   ", " #   ", " #  #", "  ## ",
        ],
        'u' => [
            "     ", "     ", "#   #", "#   #", "#   #", "#  ##", " ## #",
        ],
        'v' => [
            "     ", "     ", "#   #", "#   #", "#   #", " # # ", "  #  ",
        ],
        'y' => [
            "     ", "     ", "#   #", "#   #", " ####", "    #", " ### ",
        ],
        _ => return None,
    })
}

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: vec![WHITE; WIDTH * HEIGHT],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: u8) {
        if (0..WIDTH as i64).contains(&x) && (0..HEIGHT as i64).contains(&y) {
            self.px[y as usize * WIDTH + x as usize] = c;
        }
    }

    fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: u8) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, c);
            }
        }
    }

    /// A line `thick` pixels wide (Bresenham with a square pen).
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), thick: i64, c: u8) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.rect(x - thick / 2, y - thick / 2, thick, thick, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: u8) {
        for (i, ch) in s.chars().enumerate() {
            let Some(rows) = glyph(ch) else { continue };
            let ox = x + i as i64 * 6 * scale;
            for (ry, row) in rows.iter().enumerate() {
                for (rx, b) in row.bytes().enumerate() {
                    if b == b'#' {
                        self.rect(
                            ox + rx as i64 * scale,
                            y + ry as i64 * scale,
                            scale,
                            scale,
                            c,
                        );
                    }
                }
            }
        }
    }
}

/// Where the point (i-th of `n` ks, value) of a panel lands.
fn point(panel: usize, i: usize, n: usize, value: f64) -> (i64, i64) {
    let (left, right, top, bottom) = (60, 20, 50, 50);
    let x0 = (panel * PANEL + left) as f64;
    let w = (PANEL - left - right) as f64;
    let x = x0 + w * i as f64 / n.saturating_sub(1).max(1) as f64;
    let y = top as f64 + (HEIGHT - top - bottom) as f64 * (1.0 - value.clamp(0.0, 1.0));
    (x.round() as i64, y.round() as i64)
}

fn panel(c: &mut Canvas, p: usize, title: &str, ks: &[usize], curves: &[(&str, &Summary)]) {
    let n = ks.len();
    c.text((p * PANEL + 60) as i64, 14, title, 2, BLACK);
    for tenth in (0..=10).step_by(2) {
        let v = tenth as f64 / 10.0;
        let (x0, y) = point(p, 0, n, v);
        let (x1, _) = point(p, n.saturating_sub(1), n, v);
        c.line((x0, y), (x1, y), 1, GRID);
        c.text(x0 - 40, y - 3, &format!("{v:.1}"), 1, BLACK);
    }
    for (i, k) in ks.iter().enumerate() {
        let (x, y) = point(p, i, n, 0.0);
        c.line((x, y), (x, y + 5), 1, BLACK);
        let label = format!("{k}");
        c.text(x - 3 * label.len() as i64, y + 10, &label, 1, BLACK);
    }
    let (x, y) = point(p, n.saturating_sub(1), n, 0.0);
    c.text(x - 6, y + 24, "k", 1, BLACK);
    for (n, (_, s)) in curves.iter().enumerate() {
        let colour = LINES[n % LINES.len()];
        let pts: Vec<(i64, i64)> = ks
            .iter()
            .enumerate()
            .filter_map(|(i, k)| s.at.get(k).map(|x| point(p, i, n, x.recall_any)))
            .collect();
        for w in pts.windows(2) {
            c.line(w[0], w[1], 3, colour);
        }
        for &(x, y) in &pts {
            c.rect(x - 3, y - 3, 7, 7, colour);
        }
    }
}

/// The PNG of a report: a panel per level shown (session, turn
/// recall_any@k), one curve per mode, and a legend.
pub fn png(report: &RunReport) -> Vec<u8> {
    let mut c = Canvas::new();
    let modes: Vec<(&String, _)> = report.modes.iter().collect();
    for (p, level) in report.levels.iter().enumerate() {
        let curves: Vec<(&str, &Summary)> = modes
            .iter()
            .map(|(m, s)| {
                (
                    m.as_str(),
                    if *level == "turn" {
                        &s.turn
                    } else {
                        &s.session
                    },
                )
            })
            .collect();
        panel(
            &mut c,
            p,
            &format!("{level} recall_any@k"),
            &report.ks,
            &curves,
        );
    }
    for (n, (mode, _)) in modes.iter().enumerate() {
        let x = 60 + n as i64 * 140;
        c.rect(x, HEIGHT as i64 - 18, 24, 6, LINES[n % LINES.len()]);
        c.text(x + 30, HEIGHT as i64 - 21, mode, 2, BLACK);
    }
    encode(&c.px)
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in bytes {
        a = (a + u32::from(x)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// An 8-bit palette PNG of `px` (WIDTH × HEIGHT palette indexes), its image
/// data in stored (uncompressed) deflate blocks.
fn encode(px: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity((WIDTH + 1) * HEIGHT);
    for row in px.chunks(WIDTH) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let len = b.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(b);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(WIDTH as u32).to_be_bytes());
    ihdr.extend_from_slice(&(HEIGHT as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 3, 0, 0, 0]); // 8-bit, palette, deflate, no filter, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"PLTE", &PALETTE.concat());
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// Chunks of a PNG as (type, data), checking every CRC (for tests).
pub fn chunks(png: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, String> {
    if !png.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Err("no PNG signature".into());
    }
    let mut at = 8;
    let mut out = BTreeMap::new();
    while at + 12 <= png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes")) as usize;
        let body = png.get(at + 4..at + 8 + len).ok_or("truncated chunk")?;
        let crc = u32::from_be_bytes(
            png.get(at + 8 + len..at + 12 + len)
                .ok_or("truncated crc")?
                .try_into()
                .expect("4 bytes"),
        );
        if crc32(body) != crc {
            return Err(format!(
                "bad CRC in {}",
                String::from_utf8_lossy(&body[..4])
            ));
        }
        out.insert(
            String::from_utf8_lossy(&body[..4]).into_owned(),
            body[4..].to_vec(),
        );
        at += 12 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::metrics::{Scores, KS};
    use super::super::run::ModeSummary;
    use super::*;

    /// Palette index at (x, y), read back from the stored blocks.
    fn pixel(png: &[u8], x: usize, y: usize) -> u8 {
        let c = chunks(png).unwrap();
        let z = &c["IDAT"];
        let mut raw = Vec::new();
        let mut at = 2;
        loop {
            let last = z[at] & 1 == 1;
            let len = u16::from_le_bytes([z[at + 1], z[at + 2]]) as usize;
            raw.extend_from_slice(&z[at + 5..at + 5 + len]);
            at += 5 + len;
            if last {
                break;
            }
        }
        assert_eq!(&z[at..at + 4], &adler32(&raw).to_be_bytes());
        raw[y * (WIDTH + 1) + 1 + x]
    }

    #[test]
    fn curves_are_drawn_where_their_values_are() {
        let mut report = RunReport {
            ks: KS.to_vec(),
            levels: vec!["session", "turn"],
            ..Default::default()
        };
        for (mode, v) in [("bm25", 0.5), ("vector", 1.0)] {
            let mut s = ModeSummary::default();
            let per_k = KS
                .iter()
                .map(|&k| {
                    (
                        k,
                        Scores {
                            recall_any: v,
                            recall_all: v,
                            ndcg_any: v,
                        },
                    )
                })
                .collect();
            s.session.add(&per_k);
            s.turn.add(&per_k);
            report.modes.insert(mode.into(), s);
        }
        let png = png(&report);
        let c = chunks(&png).unwrap();
        assert_eq!(&c["IHDR"][..8], &[0, 0, 3, 192, 0, 0, 1, 144]);
        assert!(c.contains_key("IEND"));
        // bm25 (first colour) at 0.5, vector (second) at 1.0, in both panels.
        for p in 0..2 {
            let (x, y) = point(p, 2, KS.len(), 0.5);
            assert_eq!(pixel(&png, x as usize, y as usize), LINES[0]);
            let (x, y) = point(p, 2, KS.len(), 1.0);
            assert_eq!(pixel(&png, x as usize, y as usize), LINES[1]);
        }
        assert_eq!(pixel(&png, 2, 2), WHITE);
    }

    #[test]
    fn a_damaged_png_is_caught() {
        let mut png = png(&RunReport::default());
        let n = png.len();
        png[n - 20] ^= 0xff;
        assert!(chunks(&png).is_err());
    }
}
