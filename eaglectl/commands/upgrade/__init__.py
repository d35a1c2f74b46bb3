"""`eaglectl upgrade`: EAGLE-3 to 3.1, the fc_norm inits and their fitting, measured the way they will be served."""
