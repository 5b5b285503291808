"""The analysis floor: a trace read once into its timeline, phases and steps, shapes and categories
(``Analysis``), and what is measured from them."""
