"""What the README shows is what the repository ships and checks."""

from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_readme_shows_the_sharded_workflow_that_ci_lints():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Many models", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "examples" / "workflows" / "model-zoo.yml").read_text()
    assert "examples/workflows/*.yml" in (ROOT / ".ci" / "run").read_text()
