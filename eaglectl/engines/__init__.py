"""What serving engines do beside the torch model: versioned facts, their runners' readings, serve lines, engine processes, HTTP."""
