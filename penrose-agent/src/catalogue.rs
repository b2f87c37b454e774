//! The counter catalogue as `penrose-agent catalogue` lists it: one typed listing that prints
//! as text for the operator and as JSON for scripts, so that both always show the same
//! counters.

use std::fmt;

use penrose_core::counters::Catalogue;
use serde::{Deserialize, Serialize};

/// The counters the agent samples (`catalogue --json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CatalogueListing {
    /// The catalogue version reports carry.
    pub version: u16,
    /// Every counter, in id order.
    pub counters: Vec<CounterListing>,
    /// Every joint view (two counters of one group binned together), in id order.
    pub joints: Vec<JointListing>,
}

/// One joint view of the listing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JointListing {
    /// Its id, after the counters'; its reports carry it.
    pub id: u16,
    /// Its machine name.
    pub name: String,
    /// The counter along x, and its cells.
    pub x: String,
    /// Cells along x.
    pub x_cells: usize,
    /// The counter along y.
    pub y: String,
    /// Cells along y.
    pub y_cells: usize,
    /// The group both counters are read in.
    pub group: u8,
    /// What it shows.
    pub description: String,
}

/// One counter of the listing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CounterListing {
    /// Its id within the catalogue version.
    pub id: u16,
    /// Its machine name.
    pub name: String,
    /// Its unit's suffix (`%`, `ns`, `B`, or empty for a count).
    pub unit: String,
    /// The counter group it is read in.
    pub group: u8,
    /// How its values are binned, as the catalogue states it (`Linear { min: 0.0, max: 100.0 }`).
    pub binning: String,
    /// What it measures.
    pub description: String,
}

impl CatalogueListing {
    /// The listing of the catalogue this agent was built with.
    pub fn current() -> Self {
        Self::of(Catalogue::current())
    }

    /// The listing of `catalogue`.
    pub fn of(catalogue: &Catalogue) -> Self {
        Self {
            version: catalogue.version.0,
            counters: catalogue
                .counters
                .iter()
                .map(|c| CounterListing {
                    id: c.id.0,
                    name: c.name.to_string(),
                    unit: c.unit.suffix().to_string(),
                    group: c.group.0,
                    binning: format!("{:?}", c.binning),
                    description: c.description.to_string(),
                })
                .collect(),
            joints: catalogue
                .joint_views()
                .map(|j| JointListing {
                    id: j.view.id.0,
                    name: j.view.name.to_string(),
                    x: j.x.counter.name.to_string(),
                    x_cells: j.x.cells(),
                    y: j.y.counter.name.to_string(),
                    y_cells: j.y.cells(),
                    group: j.group().0,
                    description: j.view.description.to_string(),
                })
                .collect(),
        }
    }
}

/// The text form: a header line, then two lines per counter and per joint view.
impl fmt::Display for CatalogueListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "counter catalogue version {}", self.version)?;
        for c in &self.counters {
            writeln!(
                f,
                "{:>3}  {:<22} group {}  {:<4} {}\n     {}",
                c.id, c.name, c.group, c.unit, c.binning, c.description
            )?;
        }
        for j in &self.joints {
            writeln!(
                f,
                "{:>3}  {:<22} group {}  joint {} ({} cells) x {} ({} cells)\n     {}",
                j.id, j.name, j.group, j.x, j.x_cells, j.y, j.y_cells, j.description
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_every_counter_in_text_and_round_trips_through_json() {
        let listing = CatalogueListing::current();
        let catalogue = Catalogue::current();
        assert_eq!(listing.counters.len(), catalogue.counters.len());
        let text = listing.to_string();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(format!("counter catalogue version {}", catalogue.version.0).as_str())
        );
        let first = &catalogue.counters[0];
        assert_eq!(
            lines.next(),
            Some(
                format!(
                    "{:>3}  {:<22} group {}  {:<4} {:?}",
                    first.id.0,
                    first.name,
                    first.group.0,
                    first.unit.suffix(),
                    first.binning
                )
                .as_str()
            )
        );
        assert_eq!(
            lines.next(),
            Some(format!("     {}", first.description).as_str())
        );
        assert_eq!(
            text.lines().count(),
            1 + 2 * (catalogue.counters.len() + catalogue.joints.len())
        );
        assert!(
            text.contains("tensor_x_dram"),
            "joint views are listed: {text}"
        );
        assert_eq!(listing.joints.len(), catalogue.joints.len());
        let json = serde_json::to_string_pretty(&listing).unwrap();
        let back: CatalogueListing = serde_json::from_str(&json).unwrap();
        assert_eq!(back, listing);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["counters"][0]["name"], first.name);
        assert_eq!(value["counters"][0]["unit"], first.unit.suffix());
    }
}
