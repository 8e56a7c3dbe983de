"""Records: the versioned run record, the results database (SQLAlchemy, Alembic), regression
compare, the CI gate and imports."""
