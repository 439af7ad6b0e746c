"""Across the papers: what each method's symmetry tells the others (chapter 12)."""
