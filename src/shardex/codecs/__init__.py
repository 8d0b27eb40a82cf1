"""Image encodings: recognising, checking and decoding encoded image bytes."""
