"""The compiled programs: pure step maths, scanned or dispatched per step."""
