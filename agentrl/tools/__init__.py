"""What is not a runtime stage: the benchmarks (``bench``), the embedded models' recipe and the conversion
of real ones (``modelgen``), and the new-environment template (``scaffold``)."""
