//! PNG copies of the report's plots (`penrose-design report --png DIR`), for slides and
//! documents that take no SVG: the very SVG [`crate::plot`] draws, rasterised by `resvg` at twice
//! its size on a white background.
//!
//! Text needs a font, and a design server may have none: the rasteriser loads the fonts under
//! the system's font directories (Debian's `fonts-dejavu-core`, which the package recommends)
//! and uses the first sans-serif family it knows. With no font at all the plots are drawn
//! without their text, and [`Rasteriser::fonts`] says so, so the command can warn.

use std::path::Path;

use resvg::tiny_skia::{Color, Pixmap, Transform};
use resvg::usvg::{Options, Tree};
use thiserror::Error;

/// Directories searched for fonts, as on Debian.
const FONT_DIRS: [&str; 2] = ["/usr/share/fonts", "/usr/local/share/fonts"];

/// Sans-serif families preferred for the plots' `font-family="sans-serif"`, first found wins.
const SANS: [&str; 4] = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans"];

/// How many device pixels per SVG pixel: plots are drawn for a 640-pixel column, which is
/// blurry on a slide at 1.
pub const SCALE: f32 = 2.0;

/// Why a plot could not be rasterised.
#[derive(Debug, Error)]
pub enum PngError {
    /// The SVG did not parse (a bug in [`crate::plot`], never user input: labels are escaped).
    #[error("the plot's SVG does not parse: {0}")]
    Svg(#[from] resvg::usvg::Error),
    /// The plot has no area, or is too large to allocate.
    #[error("the plot is {width} x {height} pixels, which cannot be drawn")]
    Size {
        /// Width in SVG pixels.
        width: f32,
        /// Height in SVG pixels.
        height: f32,
    },
    /// The PNG encoder failed.
    #[error("encoding the PNG: {0}")]
    Encode(String),
}

/// Rasterises plots with the fonts it found once.
pub struct Rasteriser {
    options: Options<'static>,
    fonts: usize,
}

impl std::fmt::Debug for Rasteriser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rasteriser")
            .field("fonts", &self.fonts)
            .finish()
    }
}

impl Rasteriser {
    /// A rasteriser with the system's fonts.
    pub fn with_system_fonts() -> Self {
        Self::with_font_dirs(FONT_DIRS.iter().map(Path::new))
    }

    /// A rasteriser with the fonts under `dirs` (none: plots without text).
    pub fn with_font_dirs<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Self {
        let mut options = Options::default();
        let db = options.fontdb_mut();
        for dir in dirs {
            db.load_fonts_dir(dir);
        }
        let families: Vec<String> = db
            .faces()
            .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
            .collect();
        let sans = SANS
            .iter()
            .find(|s| families.iter().any(|f| f == *s))
            .map(|s| s.to_string())
            .or_else(|| families.first().cloned());
        if let Some(sans) = sans {
            db.set_sans_serif_family(sans.clone());
            options.font_family = sans;
        }
        let fonts = options.fontdb.len();
        Self { options, fonts }
    }

    /// Font faces loaded: 0 means the plots will have no text.
    pub fn fonts(&self) -> usize {
        self.fonts
    }

    /// The PNG of `svg`, at [`SCALE`] times its size, on white.
    pub fn png(&self, svg: &str) -> Result<Vec<u8>, PngError> {
        let tree = Tree::from_str(svg, &self.options)?;
        let size = tree.size();
        let too_big = |v: f32| !(v.is_finite() && v > 0.0 && v * SCALE <= 16_384.0);
        if too_big(size.width()) || too_big(size.height()) {
            return Err(PngError::Size {
                width: size.width(),
                height: size.height(),
            });
        }
        let (w, h) = (
            (size.width() * SCALE).ceil() as u32,
            (size.height() * SCALE).ceil() as u32,
        );
        let mut pixmap = Pixmap::new(w, h).ok_or(PngError::Size {
            width: size.width(),
            height: size.height(),
        })?;
        pixmap.fill(Color::WHITE);
        resvg::render(
            &tree,
            Transform::from_scale(SCALE, SCALE),
            &mut pixmap.as_mut(),
        );
        pixmap
            .encode_png()
            .map_err(|e| PngError::Encode(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::plot::tests::joint_counter;

    /// Pixels of `png` within `tolerance` of the colour `rgb`.
    fn count(png: &Pixmap, rgb: (u8, u8, u8), tolerance: u8) -> usize {
        png.pixels()
            .iter()
            .filter(|p| {
                let c = p.demultiply();
                c.red().abs_diff(rgb.0) <= tolerance
                    && c.green().abs_diff(rgb.1) <= tolerance
                    && c.blue().abs_diff(rgb.2) <= tolerance
            })
            .count()
    }

    /// The heat map rasterised: twice its SVG size, its fullest cell in the dark blue of the
    /// scale over about the cell's area, the split's dashes in red, and, when the machine has
    /// fonts, the text in ink.
    #[test]
    fn a_heat_map_rasterises_with_its_cells_split_and_text() {
        let c = joint_counter(4);
        let svg = crate::plot::heatmap(&c, c.joint.as_ref().unwrap(), Some("label"));
        let raster = Rasteriser::with_system_fonts();
        let png = Pixmap::decode_png(&raster.png(&svg).unwrap()).unwrap();
        assert_eq!((png.width(), png.height()), (1280, 660));
        // A cell is (640 - 102) / 16 by (330 - 86) / 8 SVG pixels, at scale 2.
        let cell = ((538.0 / 16.0) * 2.0 * (244.0 / 8.0) * 2.0) as usize;
        let dark = count(&png, (0x08, 0x30, 0x6b), 2);
        assert!(dark > cell / 2 && dark < cell * 2, "{dark} vs {cell}");
        assert!(
            count(&png, (0xc0, 0x39, 0x2b), 8) > 100,
            "the split's dashes"
        );
        let ink = count(&png, (0x22, 0x22, 0x22), 24);
        if raster.fonts() > 0 {
            // Axes alone are a few thousand pixels; text adds more.
            let no_text = Rasteriser::with_font_dirs([]);
            let bare = Pixmap::decode_png(&no_text.png(&svg).unwrap()).unwrap();
            let bare_ink = count(&bare, (0x22, 0x22, 0x22), 24);
            assert!(
                ink > bare_ink + 2_000,
                "text: {ink} vs {bare_ink} without fonts"
            );
        }
    }

    #[test]
    fn a_plot_that_does_not_parse_is_an_error() {
        let raster = Rasteriser::with_font_dirs([]);
        assert!(matches!(raster.png("<svg"), Err(PngError::Svg(_))));
        let huge = r#"<svg xmlns="http://www.w3.org/2000/svg" width="100000" height="10"></svg>"#;
        assert!(matches!(raster.png(huge), Err(PngError::Size { .. })));
    }
}
