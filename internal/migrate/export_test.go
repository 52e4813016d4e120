package migrate

const PglimitVersionTable = pglimitVersionTable
