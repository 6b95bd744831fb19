//! Plain-text tables and number formatting for the CLI.

/// A table with a header row; columns are left-aligned, except those marked
/// numeric, which are right-aligned.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    numeric: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// `columns` are `(title, numeric)` pairs.
    pub fn new(columns: &[(&str, bool)]) -> Self {
        Self {
            header: columns
                .iter()
                .map(|(title, _)| (*title).to_string())
                .collect(),
            numeric: columns.iter().map(|(_, numeric)| *numeric).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines indented by `indent` spaces.
    pub fn render(&self, indent: usize) -> String {
        let columns = self.header.len();
        let mut widths = vec![0; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = " ".repeat(indent);
            for (i, cell) in row.iter().enumerate().take(columns) {
                let pad = widths[i] - cell.chars().count();
                if self.numeric[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
                if i + 1 < columns {
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `1234567` → `"1,234,567"`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn numeric_columns_align_right() {
        let mut table = Table::new(&[("name", false), ("gpus", true)]);
        table.row(vec!["a".into(), "8".into()]);
        table.row(vec!["long".into(), "1,024".into()]);
        assert_eq!(table.render(0), "name   gpus\na         8\nlong  1,024\n");
    }
}
