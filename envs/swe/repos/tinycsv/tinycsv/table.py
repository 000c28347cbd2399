"""Tables of rows."""


class Table:
    """Rows (dicts) with a fixed list of columns."""

    def __init__(self, columns, rows):
        self.columns = list(columns)
        self.rows = list(rows)

    def __len__(self):
        return len(self.rows)

    def column(self, name, skip_none=False):
        """The values of column ``name``, in row order."""
        if name not in self.columns:
            raise KeyError(name)
        values = [row[name] for row in self.rows]
        if skip_none:
            values = [v for v in values if v is not None]
        return values

    def select(self, *names):
        """A table with only the given columns, in the given order."""
        for name in names:
            if name not in self.columns:
                raise KeyError(name)
        return Table(names, [{n: row[n] for n in names} for row in self.rows])

    def where(self, name, predicate):
        """Rows whose ``name`` value satisfies ``predicate``."""
        return Table(self.columns, [row for row in self.rows if predicate(row[name])])

    def sort_by(self, name, descending=False):
        """Rows sorted by ``name``; None values always go last."""
        present = [row for row in self.rows if row[name] is not None]
        missing = [row for row in self.rows if row[name] is None]
        present.sort(key=lambda row: row[name], reverse=descending)
        return Table(self.columns, present + missing)

    def group_sum(self, key, value):
        """``{key value: sum of value}`` over rows, keys in first-seen order; None values are skipped."""
        out = {}
        for row in self.rows:
            if row[value] is None:
                continue
            out[row[key]] = out.get(row[key], 0) + row[value]
        return out

    def head(self, n=5):
        return Table(self.columns, self.rows[:n])
