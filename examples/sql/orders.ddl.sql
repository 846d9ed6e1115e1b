-- Orders, one row per order id.
CREATE TABLE IF NOT EXISTS orders (
    order_id   text   PRIMARY KEY,
    sku        text   NOT NULL,
    quantity   int    NOT NULL CHECK (quantity BETWEEN 1 AND 1000),
    message_id uuid   NOT NULL
);
